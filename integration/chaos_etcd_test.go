package integration_test

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdtest"
	"github.com/fencer-dev/fencer/internal/faultproxy"
	"github.com/fencer-dev/fencer/token"
)

var chaosDuration = flag.Duration("chaos.duration", 6*time.Second, "how long each chaos test generates load")

// TestChaosEtcdFencedRegister runs holders that acquire, write and get
// frozen for longer than their session TTL (their keepalives and in-flight
// writes held back, then delivered late), while a reader reads. The history
// must be linearizable as a fenced register: no write with an older token
// lands after a write with a newer one.
func TestChaosEtcdFencedRegister(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), *chaosDuration+time.Minute)
	defer cancel()
	srv := etcdtest.Start(t)
	endpoint := srv.Endpoint()[len("http://"):]

	h := newHistory()
	var (
		nextVal                           atomic.Int64
		acquired, accepted, stale, frozen atomic.Int64
		staleAfterFreeze                  atomic.Int64
	)
	stop := time.Now().Add(*chaosDuration)

	// writeBatch writes a few values with l's token, freezing the holder's
	// connection before the write sometimes (and always before the last
	// write of a worker's first batch), so that the write arrives late. It
	// stops at the first write that is not accepted.
	writeBatch := func(w int, p *faultproxy.Proxy, st *etcdstore.Store, l *etcdstore.Lease, first bool) {
		n := 2 + rand.IntN(8)
		for i := 0; i < n && time.Now().Before(stop); i++ {
			wasFrozen := rand.IntN(6) == 0 || first && i == n-1
			if wasFrozen {
				frozen.Add(1)
				p.Freeze(time.Duration(1500+rand.IntN(1000)) * time.Millisecond)
			}
			in := regInput{write: true, tok: l.Token().Revision, val: int(nextVal.Add(1))}
			call := h.now()
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := st.Put(wctx, l.Token(), "register", []byte(strconv.Itoa(in.val)))
			wcancel()
			var out regOutput
			switch {
			case err == nil:
				out.ok = true
				accepted.Add(1)
			case errors.Is(err, token.ErrStale):
				stale.Add(1)
				if wasFrozen {
					staleAfterFreeze.Add(1)
				}
			default:
				out.unknown = true
			}
			h.add(w, in, call, out)
			if err != nil {
				return
			}
			time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
		}
	}
	worker := func(w int, p *faultproxy.Proxy, st *etcdstore.Store) {
		newSession := func() *etcdstore.Session {
			sess, err := st.NewSession(ctx, etcdstore.WithTTL(time.Second), etcdstore.WithHolder("w"+strconv.Itoa(w)))
			if err != nil {
				t.Error(err)
			}
			return sess
		}
		sess := newSession()
		defer func() {
			if sess != nil {
				_ = sess.Close(context.Background())
			}
		}()
		var l *etcdstore.Lease
		batches := 0 // written by this worker
		for sess != nil && time.Now().Before(stop) {
			if l == nil || l.Err() != nil {
				actx, acancel := context.WithTimeout(ctx, 3*time.Second)
				var err error
				l, err = sess.Acquire(actx, "register")
				acancel()
				switch {
				case errors.Is(err, etcdstore.ErrSessionExpired):
					sess = newSession()
					continue
				case err != nil:
					continue
				}
				acquired.Add(1)
			}
			writeBatch(w, p, st, l, batches == 0)
			batches++
			if rand.IntN(3) == 0 {
				_ = l.Release(ctx)
			}
		}
	}
	var wg sync.WaitGroup
	for w := 1; w <= 3; w++ {
		p := faultproxy.New(t, endpoint)
		st := newEtcdStore(t, p.Endpoint())
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(w, p, st)
		}()
	}
	reader := newEtcdStore(t, srv.Endpoint())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(stop) {
			call := h.now()
			v, ok, err := reader.Get(ctx, "register")
			if err != nil {
				continue
			}
			out := regOutput{ok: true}
			if ok {
				out.val, _ = strconv.Atoi(string(v.Data))
			}
			h.add(0, regInput{}, call, out)
			time.Sleep(3 * time.Millisecond)
		}
	}()
	wg.Wait()
	t.Logf("%d acquisitions; writes: %d accepted, %d rejected as stale (%d of them delayed by a freeze); %d freezes",
		acquired.Load(), accepted.Load(), stale.Load(), staleAfterFreeze.Load(), frozen.Load())
	require.Equal(t, porcupine.Ok, h.check(t), "the history is not linearizable as a fenced register")
	require.Positive(t, accepted.Load())
	require.Positive(t, staleAfterFreeze.Load(), "no frozen holder's late write was exercised; run longer")
}

func newEtcdStore(t *testing.T, endpoint string) *etcdstore.Store {
	t.Helper()
	st, err := etcdstore.New(etcdtest.Client(t, endpoint), etcdstore.WithPrefix("/chaos/"))
	require.NoError(t, err)
	return st
}
