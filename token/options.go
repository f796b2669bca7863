package token

// WriteOption modifies one guarded write (Put, Delete, Txn or Advance).
// The etcd store (etcdstore) and the gRPC client (client) take the same
// options, so a caller that moves between them keeps its options.
type WriteOption func(*WriteOptions)

// WriteOptions are the settings of one guarded write, as its WriteOptions
// set them (ApplyWriteOptions). The zero value is a plain guarded write.
type WriteOptions struct {
	// TakeOver makes the write take over the data keys it writes, or the
	// resource it advances, from whichever lease owns them (TakeOver).
	TakeOver bool
}

// TakeOver makes a write take over the data keys it writes (or the
// resource it advances) from whichever lease owns them, instead of
// failing with a *ForeignLeaseError. The takeover is fenced like any other
// write: it commits only if the writer's token is its lease's current
// token, checked with the write, and it records the writer's lease as the
// new owner, so the previous owner's later writes are refused. Taking over
// a key the lease already owns, or one nobody owns, is an ordinary write.
func TakeOver() WriteOption { return func(o *WriteOptions) { o.TakeOver = true } }

// ApplyWriteOptions returns the settings that opts make, applied in order.
// A nil option is skipped.
func ApplyWriteOptions(opts []WriteOption) WriteOptions {
	var o WriteOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
