package kubeadapter

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter/fenced"
)

// NewClient and WithAPIReader keep the sharding tests of this package,
// which are moving to package kubeadapter/shard, compiling until they
// call fenced.NewClient and fenced.WithAPIReader themselves; the fenced
// client lives in package kubeadapter/fenced. Delete this file then.
func NewClient(inner client.Client, holder Holder, opts ...fenced.Option) (*fenced.Client, error) {
	return fenced.NewClient(inner, holder, opts...)
}

// WithAPIReader is fenced.WithAPIReader; see NewClient.
func WithAPIReader(r client.Reader) fenced.Option { return fenced.WithAPIReader(r) }
