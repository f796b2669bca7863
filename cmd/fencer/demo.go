package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// demoCmd plays the fencing guarantee out on an embedded etcd: worker A
// acquires and writes, stalls past its TTL, B takes over and writes, and
// A's late write is rejected by etcd.
func (a *app) demoCmd() *cobra.Command {
	var dataDir string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "show a stale write being fenced, live on an embedded etcd",
		Args:  nArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return demo(cmd.Context(), dataDir, ttl, a.stdout)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "etcd data directory (default: a temporary directory, removed afterwards)")
	cmd.Flags().DurationVar(&ttl, "ttl", 2*time.Second, "session TTL of the workers (whole seconds)")
	return cmd
}

func demo(ctx context.Context, dataDir string, ttl time.Duration, out io.Writer) error {
	where := "in " + dataDir
	if dataDir == "" {
		dir, err := os.MkdirTemp("", "fencer-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dataDir, where = dir, "in a temporary directory"
	}
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "demo", Dir: dataDir})
	if err != nil {
		return err
	}
	defer srv.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	st, err := etcdstore.New(cli, etcdstore.WithPrefix("/fencer-demo/"))
	if err != nil {
		return err
	}

	start := time.Now()
	var mu sync.Mutex
	say := func(who, format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%7.3fs  %-2s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, a...))
	}
	fmt.Fprintf(out, "fencer demo: workers A and B on an embedded etcd %s\n\n", where)

	// A's keepalive runs on a clock that never moves: from the moment it
	// has acquired, A behaves like a process frozen by a long GC pause or
	// a SIGSTOP, and etcd expires its session after the TTL.
	frozen := clocktesting.NewFakeClock(time.Now())
	a, err := st.NewSession(ctx, etcdstore.WithHolder("worker-A"), etcdstore.WithTTL(ttl), etcdstore.WithClock(frozen))
	if err != nil {
		return err
	}
	defer a.Close(context.WithoutCancel(ctx))
	// A acquires at once: its session never renews, so it has one TTL.
	la, err := a.Acquire(ctx, "orders")
	if err != nil {
		return err
	}
	say("A", "acquired lease %q            token %s", "orders", la.Token())
	if _, err := st.Put(ctx, la.Token(), "orders/total", []byte("100 (written by A)")); err != nil {
		return err
	}
	say("A", "put orders/total = 100        accepted")
	say("A", "stalls: no keepalive for longer than its %s TTL", ttl)
	watchCtx, stopWatching := context.WithCancel(ctx)
	noticed, said := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(noticed)
		select {
		case <-la.Done():
			say("A", "(its own watch saw the loss: %v; a frozen process would not)", la.Err())
			close(said)
		case <-watchCtx.Done():
		}
	}()
	defer func() {
		stopWatching()
		<-noticed
	}()

	b, err := st.NewSession(ctx, etcdstore.WithHolder("worker-B"), etcdstore.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer b.Close(context.WithoutCancel(ctx))
	say("B", "waits for lease %q", "orders")
	lb, err := b.Acquire(ctx, "orders")
	if err != nil {
		return err
	}
	// A's watch and B's wait see the same deletion of A's holder key; A's
	// line goes first, so that the timeline reads the same on every run.
	select {
	case <-said:
	case <-time.After(ttl):
	case <-ctx.Done():
		return ctx.Err()
	}
	say("B", "acquired lease %q            token %s", "orders", lb.Token())
	if _, err := st.Put(ctx, lb.Token(), "orders/total", []byte("250 (written by B)")); err != nil {
		return err
	}
	say("B", "put orders/total = 250        accepted")

	select {
	case <-time.After(200 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	say("A", "wakes and sends the write it had prepared, with token %s", la.Token())
	_, err = st.Put(ctx, la.Token(), "orders/total", []byte("100 (late write by A)"))
	var stale *token.StaleError
	if !errors.As(err, &stale) {
		return fmt.Errorf("the stale write was not refused as stale (%v): the guarantee is broken", err)
	}
	say("A", "put orders/total = 100        REJECTED by etcd: %v", stale)

	v, _, err := st.Get(ctx, "orders/total")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nfinal value of orders/total: %q (modified at revision %d)\n", v.Data, v.ModRevision)
	return nil
}
