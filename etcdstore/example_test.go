package etcdstore_test

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

	a, _ := st.NewSession(ctx, etcdstore.WithHolder("a"))
	defer a.Close(ctx)
	first, _ := a.Acquire(ctx, "orders")
	fmt.Println("first:", first.Token())
	_, err = st.Put(ctx, first.Token(), "total", []byte("100"))
	fmt.Println("put with first:", err)

	_ = first.Release(ctx)
	second, _ := a.Acquire(ctx, "orders")
	fmt.Println("second:", second.Token())

	_, err = st.Put(ctx, first.Token(), "total", []byte("late"))
	fmt.Println("stale:", errors.Is(err, token.ErrStale))
	v, _, _ := st.Get(ctx, "total")
	fmt.Println("total:", string(v.Data))
	// Output:
	// first: v1:1:2:orders
	// put with first: <nil>
	// second: v1:2:5:orders
	// stale: true
	// total: 100
}

func Example_keysBelongToLeases() {
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
	sess, _ := st.NewSession(ctx)
	defer sess.Close(ctx)
	orders, _ := sess.Acquire(ctx, "orders")
	billing, _ := sess.Acquire(ctx, "billing")

	_, err = st.Put(ctx, orders.Token(), "orders/total", []byte("100")) // the first write makes orders the owner
	fmt.Println("orders writes:", err)
	_, err = st.Put(ctx, billing.Token(), "orders/total", []byte("0"))
	fmt.Println("billing writes:", err)
	_, err = st.Put(ctx, billing.Token(), "orders/total", []byte("0"), etcdstore.TakeOver())
	fmt.Println("billing takes it over:", err)
	_, err = st.Put(ctx, orders.Token(), "orders/total", []byte("250"))
	fmt.Println("orders is now foreign:", errors.Is(err, token.ErrForeignLease))
	owner, _, _ := st.Owner(ctx, "orders/total")
	fmt.Println("owner:", owner.Lease)
	// Output:
	// orders writes: <nil>
	// billing writes: etcdstore: put "orders/total": token: foreign lease: want "billing", got "orders"
	// billing takes it over: <nil>
	// orders is now foreign: true
	// owner: billing
}
