package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// A chaos holder is a separate OS process, a re-execution of the test
// binary, so that the etcd chaos test can stop it with SIGSTOP as the
// kernel would stop a paused process. It competes for the lease the test
// names on its standard input ("round <name>" lines; end of input: exit),
// writes the lease's register and releases it, and reports every operation
// as one JSON line on its standard output, timed on the wall clock, which
// the processes of one machine share.
//
// A holder writes through etcdstore on the etcd endpoints it is given (the
// test's fault proxies), or through the Go client to a fencer serve
// replica. It does not watch its lease: a holder superseded while it
// writes goes on writing with its old token until the store has refused
// it lateStubborn times, as a holder that is paused, partitioned or slow to
// notice its loss would. Those are the late writes the store must refuse.

// chaosHolderEnv marks a process started as a chaos holder; its value is
// the holder's configuration, as JSON.
const chaosHolderEnv = "FENCER_CHAOS_HOLDER"

// lateStubborn is how many refusals a holder takes before it lets its
// lease go.
const lateStubborn = 4

type holderConfig struct {
	ID     int           `json:"id"`
	Etcd   []string      `json:"etcd,omitempty"`  // etcdstore on these endpoints
	Serve  string        `json:"serve,omitempty"` // or the Go client to this fencer serve
	Prefix string        `json:"prefix"`
	TTL    time.Duration `json:"ttl"`
}

// holderOp is one operation a holder reports.
type holderOp struct {
	Round   string    `json:"r"`
	Kind    leaseKind `json:"k"`
	Tok     string    `json:"t,omitempty"` // of a write or release, or the one an acquire returned
	Val     int       `json:"v,omitempty"`
	OK      bool      `json:"ok,omitempty"`
	Unknown bool      `json:"u,omitempty"`
	Call    int64     `json:"c"` // Unix nanoseconds
	Ret     int64     `json:"e"`
}

// holderBackend is what a holder writes through.
type holderBackend interface {
	newSession(ctx context.Context) error
	sessionErr() error // nil while the session lives; an error without one
	closeSession()
	tryAcquire(ctx context.Context, name string) (token.Token, error)
	put(ctx context.Context, tok token.Token, name string, val int) error
	release(ctx context.Context, tok token.Token) error
	read(ctx context.Context, name string) error
}

// runChaosHolderIfAsked runs a chaos holder and exits if this process was
// started as one. Otherwise it returns at once.
func runChaosHolderIfAsked() {
	conf := os.Getenv(chaosHolderEnv)
	if conf == "" {
		return
	}
	var cfg holderConfig
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "chaos holder: %v\n", err)
		os.Exit(2)
	}
	if err := runChaosHolder(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "chaos holder %d: %v\n", cfg.ID, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChaosHolder(cfg holderConfig) error {
	var b holderBackend
	if cfg.Serve != "" {
		cc, err := grpc.NewClient("passthrough:///"+cfg.Serve, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		b = &clientBackend{c: client.New(cc), ttl: cfg.TTL}
	} else {
		cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		st, err := etcdstore.New(cli, etcdstore.WithPrefix(cfg.Prefix))
		if err != nil {
			return err
		}
		b = &storeBackend{st: st, ttl: cfg.TTL, holder: "h" + strconv.Itoa(cfg.ID)}
	}
	h := &processHolder{id: cfg.ID, b: b, out: json.NewEncoder(os.Stdout)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var name string
			if _, err := fmt.Sscanf(sc.Text(), "round %s", &name); err == nil {
				h.mu.Lock()
				h.round = name
				h.mu.Unlock()
			}
		}
		cancel() // the test is done with this holder
	}()
	h.run(ctx)
	return nil
}

type processHolder struct {
	id   int
	b    holderBackend
	next int // of the values this holder writes

	outMu sync.Mutex
	out   *json.Encoder

	mu    sync.Mutex
	round string
}

func (h *processHolder) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.round
}

func (h *processHolder) report(op holderOp) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	_ = h.out.Encode(op)
}

// run acquires, writes and releases the current round's lease until ctx
// ends.
func (h *processHolder) run(ctx context.Context) {
	defer h.b.closeSession()
	for ctx.Err() == nil {
		name := h.current()
		if name == "" {
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		if h.b.sessionErr() != nil {
			h.b.closeSession()
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := h.b.newSession(sctx)
			cancel()
			if err != nil {
				sleepCtx(ctx, 50*time.Millisecond)
				continue
			}
		}
		tok, ok, unknown := h.acquire(ctx, name)
		switch {
		case unknown:
			h.waitReachable(ctx)
			continue
		case !ok:
			sleepCtx(ctx, time.Duration(5+rand.IntN(10))*time.Millisecond)
			continue
		}
		h.writeSome(ctx, name, tok)
		rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		call := time.Now()
		err := h.b.release(rctx, tok)
		cancel()
		h.report(holderOp{Round: name, Kind: opRelease, Tok: tok.String(), OK: err == nil, Unknown: err != nil, Call: call.UnixNano(), Ret: time.Now().UnixNano()})
		if err != nil {
			fmt.Fprintf(os.Stderr, "release %s: %v\n", tok, err)
			h.b.closeSession()
			h.waitReachable(ctx)
		}
	}
}

// waitReachable waits, after an operation of unknown outcome, until a read
// succeeds, so that a holder whose etcd member or fencer serve replica is
// down does not fill the history with operations of unknown outcome, each
// of which the checker must place anywhere after its call.
func (h *processHolder) waitReachable(ctx context.Context) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := h.b.read(rctx, h.current())
		cancel()
		if err == nil {
			return
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// acquire tries once to acquire lease name, and reports whether it did
// or whether that is unknown. A refusal that shows nothing was acquired is
// not reported.
func (h *processHolder) acquire(ctx context.Context, name string) (tok token.Token, ok, unknown bool) {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	call := time.Now()
	tok, err := h.b.tryAcquire(actx, name)
	op := holderOp{Round: name, Kind: opAcquire, Call: call.UnixNano()}
	switch {
	case err == nil:
		op.OK, op.Tok = true, tok.String()
	case errors.Is(err, token.ErrHeldByAnother), errors.Is(err, etcdstore.ErrAlreadyHeld), errors.Is(err, token.ErrLockDelay):
		return token.Token{}, false, false
	default:
		// A timeout, a member or replica killed under the call: it may
		// have committed. Whatever it acquired ends with the session.
		op.Unknown = true
		fmt.Fprintf(os.Stderr, "acquire %s: %v\n", name, err)
		h.b.closeSession()
	}
	op.Ret = time.Now().UnixNano()
	h.report(op)
	return tok, err == nil, op.Unknown
}

// writeSome writes lease name's register with tok a few dozen times, until
// the store has refused lateStubborn writes or a write's outcome is
// unknown.
func (h *processHolder) writeSome(ctx context.Context, name string, tok token.Token) {
	refused := 0
	for i, n := 0, 10+rand.IntN(40); i < n; i++ {
		h.next++
		val := h.id*100_000_000 + h.next
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		call := time.Now()
		err := h.b.put(wctx, tok, name, val)
		cancel()
		op := holderOp{Round: name, Kind: opWrite, Tok: tok.String(), Val: val, Call: call.UnixNano(), Ret: time.Now().UnixNano()}
		switch {
		case err == nil:
			op.OK = true
		case errors.Is(err, token.ErrStale):
			refused++
		default:
			op.Unknown = true
			fmt.Fprintf(os.Stderr, "write %s with %s: %v\n", name, tok, err)
		}
		h.report(op)
		if op.Unknown {
			h.waitReachable(ctx)
			return
		}
		if refused == lateStubborn || h.current() != name {
			return
		}
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
	}
}

// holderSession is the session of a holder's backend.
type holderSession interface {
	*etcdstore.Session | *client.Session
	Err() error
	Close(ctx context.Context) error
}

// sessionSlot holds a backend's session; nil: none.
type sessionSlot[S holderSession] struct{ sess S }

func (b *sessionSlot[S]) sessionErr() error {
	if b.sess == nil {
		return token.ErrSessionClosed
	}
	return b.sess.Err()
}

func (b *sessionSlot[S]) closeSession() {
	if b.sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = b.sess.Close(ctx)
	b.sess = nil
}

// storeBackend is a holder on etcdstore.
type storeBackend struct {
	sessionSlot[*etcdstore.Session]
	st     *etcdstore.Store
	ttl    time.Duration
	holder string
}

func (b *storeBackend) newSession(ctx context.Context) error {
	s, err := b.st.NewSession(ctx, etcdstore.WithTTL(b.ttl), etcdstore.WithHolder(b.holder))
	b.sess = s
	return err
}

func (b *storeBackend) tryAcquire(ctx context.Context, name string) (token.Token, error) {
	l, err := b.sess.TryAcquire(ctx, name)
	if err != nil {
		return token.Token{}, err
	}
	return l.Token(), nil
}

func (b *storeBackend) put(ctx context.Context, tok token.Token, name string, val int) error {
	_, err := b.st.Put(ctx, tok, name, []byte(strconv.Itoa(val)))
	return err
}

func (b *storeBackend) read(ctx context.Context, name string) error {
	_, _, err := b.st.Get(ctx, name)
	return err
}

// release is the holder's clean release (Lease.Release's), or the store's
// Release if the holder has no session any more.
func (b *storeBackend) release(ctx context.Context, tok token.Token) error {
	var err error
	if b.sess != nil {
		_, err = b.st.ReleaseOn(ctx, tok, b.sess.LeaseID())
	} else {
		_, err = b.st.Release(ctx, tok)
	}
	return err
}

// clientBackend is a holder on the Go client, through a fencer serve
// replica.
type clientBackend struct {
	sessionSlot[*client.Session]
	c   *client.Client
	ttl time.Duration
}

func (b *clientBackend) newSession(context.Context) error {
	s, err := b.c.NewSession(client.WithTTL(b.ttl))
	b.sess = s
	return err
}

func (b *clientBackend) tryAcquire(ctx context.Context, name string) (token.Token, error) {
	l, err := b.sess.TryAcquire(ctx, name)
	if err != nil {
		return token.Token{}, err
	}
	return l.Token(), nil
}

func (b *clientBackend) put(ctx context.Context, tok token.Token, name string, val int) error {
	_, err := b.c.Put(ctx, tok, name, []byte(strconv.Itoa(val)))
	return err
}

func (b *clientBackend) read(ctx context.Context, name string) error {
	_, _, err := b.c.Get(ctx, name)
	return err
}

func (b *clientBackend) release(ctx context.Context, tok token.Token) error {
	_, err := b.c.Release(ctx, tok)
	return err
}
