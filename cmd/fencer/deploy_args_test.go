package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestDeploymentArgs checks deploy/service/deployment.yaml against fencer
// serve itself: its arguments, followed by -h, parse (an unknown flag or a
// bad value would fail; help goes to standard output); they pass the
// check of authentication against authorization flags that fencer serve
// makes before it starts (checkAuthz); and each environment variable it
// sets is one that a flag reads.
func TestDeploymentArgs(t *testing.T) {
	b, err := os.ReadFile("../../deploy/service/deployment.yaml")
	require.NoError(t, err)
	var dep appsv1.Deployment
	require.NoError(t, yaml.UnmarshalStrict(b, &dep))
	require.Len(t, dep.Spec.Template.Spec.Containers, 1)
	c := dep.Spec.Template.Spec.Containers[0]
	require.NotEmpty(t, c.Args)
	require.Equal(t, "serve", c.Args[0])
	var stdout, stderr bytes.Buffer
	code := runServe(context.Background(), append(c.Args[1:], "-h"), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var f serveFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	require.NoError(t, fs.Parse(c.Args[1:]))
	require.NoError(t, f.checkAuthz(), "fencer serve would refuse the Deployment's arguments")
	require.NotEmpty(t, c.Env)
	for _, e := range c.Env {
		require.Regexp(t, `\$`+regexp.QuoteMeta(e.Name)+`\b`, stdout.String(), "no flag of fencer serve reads $%s", e.Name)
	}
}
