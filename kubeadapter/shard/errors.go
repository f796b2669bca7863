package shard

import "errors"

// Sentinel errors of this package. Match them with errors.Is. A Held or a
// Delegate that ends does so with a *kubeadapter.LostError whose Reason is
// ErrMoved, ErrMemberLost or kubeadapter.ErrReleased; it matches
// token.ErrNotHeld too.
var (
	// ErrNotOwner means this member does not own the shard now. It is
	// returned together with token.ErrNotHeld, so errors.Is matches both.
	ErrNotOwner = errors.New("shard: not owner")
	// ErrMoved is the reason a Held ended because the shard was handed
	// off, taken over or its Lease deleted.
	ErrMoved = errors.New("shard: moved")
	// ErrMemberLost is the reason a Held ended because the member's
	// heartbeat kubeadapter.Held ended.
	ErrMemberLost = errors.New("shard: member lost")
)
