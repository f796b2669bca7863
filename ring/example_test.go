package ring_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "fencer-example-")
	defer os.RemoveAll(dir)
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "example", Dir: dir})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	st, _ := etcdstore.New(cli)

	created, _ := ring.Define(ctx, st, "orders", []string{"eu", "us", "apac"})
	fmt.Println("defined:", created)

	// A member joins on its session, which keeps its etcd lease alive.
	sess, _ := st.NewSession(ctx, etcdstore.WithHolder("worker-1"))
	defer sess.Close(ctx)
	m, err := ring.Join(ctx, st, ring.Config{Ring: "orders", Member: "worker-1", Holder: sess.Holder(), LeaseID: sess.LeaseID()})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	for gained := 0; gained < 3; {
		for _, c := range (<-m.Updates()).Changes {
			if c.Kind == ring.Gained {
				gained++
			}
		}
	}
	tok, owns := m.Owns("eu")
	fmt.Println("owns eu:", owns, tok.Lease)

	// The shard's token guards writes like any lease's.
	_, err = st.Put(ctx, tok, "eu/total", []byte("100"))
	fmt.Println("put:", err)

	// Leaving hands every shard off: each is reported Losing, and released
	// as soon as the work on it has drained. Updates closes when all are.
	_ = m.Leave(ctx)
	for b := range m.Updates() {
		for _, c := range b.Changes {
			if c.Kind == ring.Losing {
				_, _ = m.Release(ctx, c.Shard)
			}
		}
	}
	fmt.Println("left:", errors.Is(m.Err(), ring.ErrLeft))
	// A write with the old token is refused.
	_, err = st.Put(ctx, tok, "eu/total", []byte("late"))
	fmt.Println("stale:", errors.Is(err, token.ErrStale))
	// Output:
	// defined: true
	// owns eu: true ring:orders:eu
	// put: <nil>
	// left: true
	// stale: true
}
