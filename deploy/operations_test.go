package deploy_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// shellCommands returns the commands of the sh blocks of a Markdown text,
// each with its line continuations joined.
func shellCommands(text string) []string {
	var cmds []string
	for _, block := range regexp.MustCompile("(?s)\n```sh\n(.*?)\n```").FindAllStringSubmatch(text, -1) {
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", " "), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				cmds = append(cmds, line)
			}
		}
	}
	return cmds
}

// secretFiles returns, for each Secret the Deployment's pods mount, the
// keys of it that the container names in its args and env (a path under
// the Secret's mount path).
func secretFiles(t *testing.T, dep appsv1.Deployment) map[string][]string {
	t.Helper()
	spec := dep.Spec.Template.Spec
	secrets := map[string]string{} // volume name → Secret name
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	require.NotEmpty(t, secrets, "the Deployment mounts no Secret")
	files := map[string][]string{}
	for _, c := range spec.Containers {
		var named []string
		named = append(named, c.Args...)
		for _, e := range c.Env {
			named = append(named, e.Value)
		}
		for _, m := range c.VolumeMounts {
			secret, ok := secrets[m.Name]
			if !ok {
				continue
			}
			for _, n := range named {
				_, path, _ := strings.Cut(n, "=") // a flag's value, or the whole value
				if path == "" {
					path = n
				}
				if key, ok := strings.CutPrefix(path, m.MountPath+"/"); ok && !slices.Contains(files[secret], key) {
					files[secret] = append(files[secret], key)
				}
			}
		}
	}
	for _, s := range secrets {
		require.NotEmpty(t, files[s], "the container names no file of the Secret %s it mounts", s)
	}
	return files
}

// TestOperationsDeployCommands checks that docs/operations.md gives the
// commands that deploy/service needs before kubectl apply -k, derived from
// the manifests so that they cannot drift: a kubectl create secret generic
// in the kustomization's namespace for every Secret the Deployment mounts,
// with a --from-file for every key of it the container uses; a docker
// build that passes every ARG of the Dockerfile; and a kustomize edit set
// image for every image the kustomization maps.
func TestOperationsDeployCommands(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	cmds := shellCommands(string(doc))

	var kust types.Kustomization
	b, err := os.ReadFile("service/kustomization.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &kust))
	require.NotEmpty(t, kust.Namespace)
	var dep appsv1.Deployment
	b, err = os.ReadFile("service/deployment.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &dep))

	for secret, keys := range secretFiles(t, dep) {
		var found string
		for _, c := range cmds {
			if f := strings.Fields(c); len(f) > 4 && strings.Join(f[:5], " ") == "kubectl create secret generic "+secret {
				found = c
			}
		}
		require.NotEmpty(t, found, "docs/operations.md has no kubectl create secret generic %s", secret)
		require.Regexp(t, `(^| )(-n|--namespace)[ =]`+regexp.QuoteMeta(kust.Namespace)+`( |$)`, found, "kubectl create secret generic %s: not in namespace %s", secret, kust.Namespace)
		for _, k := range keys {
			require.Contains(t, found, " --from-file="+k+"=", "kubectl create secret generic %s: no file for key %s", secret, k)
		}
	}

	dockerfile, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	var build string
	for _, c := range cmds {
		if strings.HasPrefix(c, "docker build ") {
			build = c
		}
	}
	require.NotEmpty(t, build, "docs/operations.md has no docker build")
	for _, arg := range regexp.MustCompile(`(?m)^ARG (\w+)`).FindAllStringSubmatch(string(dockerfile), -1) {
		require.Contains(t, build, "--build-arg "+arg[1]+"=", "the docker build does not pass the Dockerfile's ARG %s", arg[1])
	}

	require.NotEmpty(t, kust.Images, "the kustomization maps no image")
	for _, img := range kust.Images {
		found := slices.ContainsFunc(cmds, func(c string) bool {
			return strings.Contains(c, "kustomize edit set image "+img.Name+"=")
		})
		require.True(t, found, "docs/operations.md does not set the image %s with kustomize edit set image", img.Name)
	}
}
