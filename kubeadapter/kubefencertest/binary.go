package kubefencertest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// BinaryEnv is the environment variable that, when set, names the
// kube-apiserver binary to run instead of the one in the repository's cache.
const BinaryEnv = "FENCER_KUBE_APISERVER"

// modulePath is fencer's main module, whose go.mod marks the repository root.
const modulePath = "github.com/fencer-dev/fencer"

// EtcdEnv is the environment variable that, when set, names the etcd
// binary that StartAPIServer runs for the API server, instead of the one in
// the repository's cache.
const EtcdEnv = "FENCER_ETCD"

// ErrNoBinary reports that the kube-apiserver binary is not where BinaryPath
// looks for it. Build it with make kube-apiserver.
var ErrNoBinary = errors.New("kubefencertest: kube-apiserver binary not found (build it with make kube-apiserver)")

// ErrNoEtcd reports that the etcd binary is not where EtcdPath looks for
// it. Build it with make kube-apiserver, which builds both.
var ErrNoEtcd = errors.New("kubefencertest: etcd binary not found (build it with make kube-apiserver)")

// BinaryPath returns the kube-apiserver binary to run: the file named by the
// FENCER_KUBE_APISERVER environment variable when it is set, and otherwise
// .cache/bin/kube-apiserver under the root of the fencer repository that
// contains the working directory. The error wraps ErrNoBinary when that file
// does not exist. BinaryPath does not check that the file is a working
// kube-apiserver or which version it is.
func BinaryPath() (string, error) {
	return cachedBinary(BinaryEnv, "kube-apiserver", ErrNoBinary)
}

// EtcdPath returns the etcd binary that StartAPIServer runs: the file named
// by the FENCER_ETCD environment variable when it is set, and otherwise
// .cache/bin/etcd under the root of the fencer repository that contains the
// working directory (make kube-apiserver builds it from the etcd module
// that fencer's root module requires). The error wraps ErrNoEtcd when that
// file does not exist. EtcdPath does not check which version it is.
func EtcdPath() (string, error) {
	return cachedBinary(EtcdEnv, "etcd", ErrNoEtcd)
}

// cachedBinary returns the file that the environment variable env names,
// or else .cache/bin/name under the repository root; missing wraps errNo.
func cachedBinary(env, name string, errNo error) (string, error) {
	path := os.Getenv(env)
	if path == "" {
		root, err := repoRoot(env)
		if err != nil {
			return "", err
		}
		path = filepath.Join(root, ".cache", "bin", name)
	}
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%w: %s", errNo, path)
	case err != nil:
		return "", fmt.Errorf("kubefencertest: %w", err)
	case info.IsDir():
		return "", fmt.Errorf("%w: %s is a directory", errNo, path)
	}
	return path, nil
}

// repoRoot walks up from the working directory to the directory whose go.mod
// declares fencer's main module. Nested modules, such as this package's own
// and tools/kube-apiserver, are passed over. env names the variable that
// would spare the search, for the error.
func repoRoot(env string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubefencertest: find repository root: %w", err)
	}
	for {
		path, err := goModModule(filepath.Join(dir, "go.mod"))
		if err != nil {
			return "", err
		}
		if path == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("kubefencertest: no go.mod of module %s above the working directory; set %s", modulePath, env)
		}
		dir = parent
	}
}

// goModModule returns the module path declared in the go.mod file at path,
// or "" when there is no such file.
func goModModule(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("kubefencertest: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("kubefencertest: read %s: %w", path, err)
	}
	return "", nil
}
