//go:build tools

// Package tools records the kube-apiserver command as a dependency of this
// module, so that go mod tidy keeps everything needed to build it.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
