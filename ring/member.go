package ring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// Defaults of Config.
const (
	// DefaultDrain is Config.Drain's default.
	DefaultDrain = 5 * time.Second
	// DefaultMovesPerSecond is Config.MovesPerSecond's default.
	DefaultMovesPerSecond = 100
)

// Config says which ring a member joins, as whom, and how it hands shards
// off.
type Config struct {
	// Ring and Member name the ring and this member (ValidateRing,
	// ValidateMember). A member name is taken by one session at a time.
	Ring, Member string
	// Holder is the holder identity written into the shard holder keys:
	// the session's (the service's are "<principal>/<session id>"), 1 to
	// MaxHolderLen bytes of UTF-8.
	Holder string
	// LeaseID is the member's session, an etcd lease that the caller
	// granted and keeps alive: Join never keeps it alive. The member key
	// and every shard the member holds are attached to it, so they vanish
	// together when it ends.
	LeaseID clientv3.LeaseID
	// Drain is how long a shard reported Losing stays held before the
	// member releases it anyway; 0 means DefaultDrain.
	Drain time.Duration
	// MovesPerSecond bounds the hand-offs (Losing reports) the member
	// starts per second, with bursts of up to its ceiling; 0 means
	// DefaultMovesPerSecond. Acquisitions of free shards are not limited.
	MovesPerSecond float64
	// Clock times drains and the moves limit; nil means the real clock.
	Clock clock.Clock
}

// withDefaults validates c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if err := ValidateRing(c.Ring); err != nil {
		return c, err
	}
	if err := ValidateMember(c.Member); err != nil {
		return c, err
	}
	switch {
	case c.Holder == "" || len(c.Holder) > MaxHolderLen || !utf8.ValidString(c.Holder):
		return c, token.InvalidArgument("holder", c.Holder, "want 1 to 512 bytes of UTF-8")
	case c.LeaseID == 0:
		return c, token.InvalidArgument("lease id", "0", "not an etcd lease")
	case c.Drain < 0:
		return c, token.InvalidArgument("drain", c.Drain.String(), "negative")
	case !(c.MovesPerSecond >= 0): // NaN too
		return c, token.InvalidArgument("moves per second", strconv.FormatFloat(c.MovesPerSecond, 'g', -1, 64), "negative")
	}
	if c.Drain == 0 {
		c.Drain = DefaultDrain
	}
	if c.MovesPerSecond == 0 {
		c.MovesPerSecond = DefaultMovesPerSecond
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c, nil
}

// Kind is the kind of a Change.
type Kind int

// The kinds of Change.
const (
	// Gained: the member now holds the shard, with the change's Token.
	Gained Kind = iota + 1
	// Losing: the shard is assigned to another member. The member still
	// holds it; it should finish or abandon its work on the shard and
	// call Release, or the shard is released after the change's Drain.
	// It is released even if it is assigned back to the member meanwhile;
	// the member then acquires it again, with a new token.
	Losing
	// Lost: the member no longer holds the shard; writes guarded by the
	// change's Token are refused from now on (or soon will be, when the
	// session expired and etcd has yet to notice).
	Lost
)

// String returns "Gained", "Losing" or "Lost".
func (k Kind) String() string {
	switch k {
	case Gained:
		return "Gained"
	case Losing:
		return "Losing"
	case Lost:
		return "Lost"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Change is one change of a member's ownership of one shard.
type Change struct {
	// Kind is what changed.
	Kind Kind
	// Shard is the shard that changed.
	Shard string
	// Token is the shard's token of the member's acquisition.
	Token token.Token
	// Drain is, for Losing only, how long the member keeps the shard
	// unless Release hands it off sooner.
	Drain time.Duration
}

// Batch is a group of changes delivered together by Updates, in order.
type Batch struct {
	// Snapshot is true for the first batch only: its changes are a Gained
	// for each shard the member holds when it starts (the shards its
	// session already held), not changes to earlier batches.
	Snapshot bool
	// Changes are the changes, in the order they happened.
	Changes []Change
	// Revision is the latest etcd revision the member had observed.
	Revision int64
}

// Member is a member of a ring: one loop, started by Join, that acquires
// the shards assigned to the member and hands off the others. Methods are
// safe for concurrent use.
type Member struct {
	st      *etcdstore.Store
	cfg     Config
	key     string // the member key
	active  string // the member key's value while active
	stop    context.CancelFunc
	reqs    chan any // releaseReq, releaseDone, leaveNote: from callers to the loop
	updates chan Batch
	done    chan struct{} // closed when the loop has stopped
	abandon chan struct{} // closed by Close: stop delivering batches
	once    sync.Once
	wg      sync.WaitGroup // the member's goroutine

	mu   sync.Mutex
	owns map[string]token.Token
	err  error
}

// Join makes the session cfg.LeaseID a member of cfg.Ring named
// cfg.Member and starts the member's loop, which runs until Leave has
// handed everything off, Close, or the session ends. ctx bounds Join's own
// requests only. It writes the member key on the session's lease, and
// returns ErrRingNotFound if the ring is not defined, ErrRingConflict if
// another session holds the member name, or an error wrapping
// token.ErrSessionExpired if the session has ended; nothing is written
// then. Join is idempotent for the same LeaseID: joining again (after
// Close, or from another process) marks the member active and takes over
// the shards the session holds.
func Join(ctx context.Context, st *etcdstore.Store, cfg Config) (*Member, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	shards, err := Shards(ctx, st, cfg.Ring)
	if err != nil {
		return nil, err
	}
	m := &Member{
		st:      st,
		cfg:     cfg,
		key:     memberPrefix(st, cfg.Ring) + cfg.Member,
		active:  memberValue{Holder: cfg.Holder, State: stateActive}.encode(),
		reqs:    make(chan any),
		updates: make(chan Batch),
		done:    make(chan struct{}),
		abandon: make(chan struct{}),
		owns:    map[string]token.Token{},
	}
	if err := m.register(ctx); err != nil {
		return nil, err
	}
	s := newState(m, shards)
	if err := s.read(ctx); err != nil {
		// Take the member key back, so no shard is assigned to a member
		// that runs no loop; if this fails too, it expires with the session.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retryDelay)
		defer cancel()
		_, _ = st.Client().Txn(dctx).If(clientv3.Compare(clientv3.LeaseValue(m.key), "=", int64(cfg.LeaseID))).
			Then(clientv3.OpDelete(m.key)).Commit()
		return nil, err
	}
	lctx, stop := context.WithCancel(context.Background())
	m.stop = stop
	m.wg.Add(1)
	go m.run(lctx, s)
	return m, nil
}

// register writes the member key, active, on the member's session: if it
// is absent, or already on the same session.
func (m *Member) register(ctx context.Context) error {
	cli, rk, id := m.st.Client(), recordKey(m.st, m.cfg.Ring), m.cfg.LeaseID
	ringExists := clientv3.Compare(clientv3.Version(rk), ">", 0)
	put := clientv3.OpPut(m.key, m.active, clientv3.WithLease(id))
	for {
		resp, err := cli.Txn(ctx).
			If(ringExists, clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0)).Then(put).
			Else(clientv3.OpGet(rk, clientv3.WithCountOnly()), clientv3.OpGet(m.key)).Commit()
		if err != nil {
			return m.joinError(err)
		}
		if resp.Succeeded {
			return nil
		}
		if resp.Responses[0].GetResponseRange().Count == 0 {
			return fmt.Errorf("%w: %q", ErrRingNotFound, m.cfg.Ring)
		}
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // it expired since: try again
		}
		if clientv3.LeaseID(kvs[0].Lease) != id {
			return fmt.Errorf("%w: member %q of ring %q is taken by another session", ErrRingConflict, m.cfg.Member, m.cfg.Ring)
		}
		resp, err = cli.Txn(ctx).
			If(ringExists, clientv3.Compare(clientv3.ModRevision(m.key), "=", kvs[0].ModRevision)).Then(put).Commit()
		if err != nil {
			return m.joinError(err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

func (m *Member) joinError(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		err = fmt.Errorf("%w (%w)", token.ErrSessionExpired, err)
	}
	return fmt.Errorf("ring: join %q as %q: %w", m.cfg.Ring, m.cfg.Member, err)
}

// Name returns the member's name.
func (m *Member) Name() string { return m.cfg.Member }

// Updates returns the member's changes. The first batch is a Snapshot of
// every shard the member holds when it started; later batches are changes
// in order. Changes that the reader has not taken yet are merged into one
// batch, so the loop never waits for the reader. There must be one reader.
// The channel is closed when the member has stopped and the reader has
// taken every batch, or at once by Close.
func (m *Member) Updates() <-chan Batch { return m.updates }

// Owns returns the shard's token if the member holds shard, from memory:
// it is true from the Gained change until the member starts to release
// the shard (before the release is sent), observes its loss, or stops. It may
// still be true for a while after the session expired unobserved, which
// is why writes must be guarded by the token, not by Owns.
func (m *Member) Owns(shard string) (token.Token, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tok, ok := m.owns[shard]
	return tok, ok
}

// Release releases the given shards that the member holds and has
// reported Losing, at once, so their new owners can acquire them, and
// returns how many it released. Shards the member does not hold are
// skipped. If one of them is held but not Losing, it releases none and
// returns an error wrapping ErrNotLosing. ctx bounds the releases; the
// shards whose release failed (ctx ended, etcd failed) are held again, and
// the loop releases them a second later.
func (m *Member) Release(ctx context.Context, shards ...string) (int, error) {
	req := releaseReq{shards: shards, reply: make(chan releaseReply, 1)}
	if err := m.ask(ctx, req); err != nil {
		return 0, err
	}
	var rep releaseReply
	select {
	case rep = <-req.reply:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if rep.err != nil {
		return 0, rep.err
	}
	var (
		released atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		failed   []token.Token
		first    error
	)
	slots := make(chan struct{}, maxInFlight)
	for _, tok := range rep.toks {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			ok, err := m.st.ReleaseOn(ctx, tok, m.cfg.LeaseID)
			switch {
			case err != nil:
				mu.Lock()
				failed, first = append(failed, tok), cmp.Or(first, err)
				mu.Unlock()
			case ok:
				released.Add(1)
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		// The loop learns of the releases from its watch, and here of
		// those that failed: it holds them again.
		_ = m.ask(context.WithoutCancel(ctx), releaseFailed{toks: failed})
		return int(released.Load()), fmt.Errorf("ring: release %d of %d shards of %q: %w", len(failed), len(rep.toks), m.cfg.Ring, first)
	}
	return int(released.Load()), nil
}

// ask sends req to the loop, or returns why it cannot.
func (m *Member) ask(ctx context.Context, req any) error {
	select {
	case m.reqs <- req:
		return nil
	case <-m.done:
		return m.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Leave marks the member leaving and returns: the other members stop
// assigning shards to it, it reports every shard it holds Losing (at the
// moves limit) and releases each as Release or its drain says, then it
// deletes its member key and stops with ErrLeft, and Updates closes once
// the reader has taken the last Lost. Leaving twice is not an error.
func (m *Member) Leave(ctx context.Context) error {
	if err := m.Err(); err != nil {
		if errors.Is(err, ErrLeft) {
			return nil
		}
		return err
	}
	leaving := memberValue{Holder: m.cfg.Holder, State: stateLeaving}.encode()
	resp, err := m.st.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(m.key), "=", int64(m.cfg.LeaseID)),
			clientv3.Compare(clientv3.Value(m.key), "=", m.active)).
		Then(clientv3.OpPut(m.key, leaving, clientv3.WithLease(m.cfg.LeaseID))).
		Else(clientv3.OpGet(m.key)).Commit()
	if err != nil {
		return fmt.Errorf("ring: leave %q: %w", m.cfg.Ring, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != m.cfg.LeaseID || string(kvs[0].Value) != leaving {
			return fmt.Errorf("ring: leave %q: the member key is gone: %w", m.cfg.Ring, token.ErrSessionExpired)
		}
	}
	// The loop also learns of it from its watch: tell it sooner.
	if err := m.ask(ctx, leaveNote{}); err != nil && !errors.Is(err, ErrLeft) && ctx.Err() == nil {
		return err
	}
	return nil
}

// Close stops the member's loop and closes Updates at once, dropping the
// batches the reader has not taken. It keeps what the member holds: the
// member key and the shards stay on the session, which still owns them,
// until the session ends or a Join with the same LeaseID takes them over.
// Close waits for the member's goroutine to end; call it even after the
// member stopped by itself, unless Updates was read until closed. Closing
// twice is harmless.
func (m *Member) Close() {
	m.once.Do(func() {
		m.stop()
		close(m.abandon)
	})
	m.wg.Wait()
}

// Done is closed when the member has stopped: left, closed, or its
// session ended.
func (m *Member) Done() <-chan struct{} { return m.done }

// Err returns nil while the member runs, then why it stopped: ErrLeft,
// ErrClosed, or an error wrapping token.ErrSessionExpired when its session
// ended (its member key expired or its lease was not found).
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}
