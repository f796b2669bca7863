package client

import (
	"context"

	"github.com/fencer-dev/fencer/token"
)

// A Lease is a token.Holder, like the library's etcdstore.Lease and
// kubeadapter.Held, so helpers that fence a write take any of them.
var _ token.Holder = (*Lease)(nil)

// Context returns a context that is done when this acquisition ends, as
// Done closes; its cause (context.Cause) is what Err returns. Work bound
// to it stops promptly but advisorily; writes are fenced by the store.
func (l *Lease) Context() context.Context { return l.ctx }
