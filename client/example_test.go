package client_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/token"
)

// Example holds the lease "orders" through fencer serve at $FENCER_SERVER
// (host:port, e.g. 127.0.0.1:7890; make run starts one) and writes under
// it. A write with the token after the lease is released is refused as
// stale: that is the fence.
func Example() {
	ctx := context.Background()
	cc, err := grpc.NewClient(os.Getenv("FENCER_SERVER"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	c := client.New(cc)

	sess, err := c.NewSession() // one server session for any number of leases, renewed in the background
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	lease, err := sess.Acquire(ctx, "orders") // waits while another holder has it
	if err != nil {
		log.Fatal(err)
	}
	tok := lease.Token()
	if _, err := c.Put(ctx, tok, "orders/total", []byte("250")); err != nil { // commits only while tok is current
		log.Fatal(err)
	}
	v, found, err := c.Get(ctx, "orders/total")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("orders/total = %s (found %t)\n", v.Data, found)

	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = c.Put(ctx, tok, "orders/total", []byte("300"))
	fmt.Println("a write after release is stale:", errors.Is(err, token.ErrStale))
	// Output:
	// orders/total = 250 (found true)
	// a write after release is stale: true
}

// ExampleSession_JoinRing joins a ring of 4 shards as its only member,
// so it comes to own them all, writes under a shard's token, and leaves,
// handing each shard off as it is reported Losing.
func ExampleSession_JoinRing() {
	ctx := context.Background()
	cc, err := grpc.NewClient(os.Getenv("FENCER_SERVER"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	c := client.New(cc)
	if _, err := c.CreateRingCount(ctx, "example-shards", 4); err != nil { // shards "0" to "3"
		log.Fatal(err)
	}
	sess, err := c.NewSession()
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)
	ring, err := sess.JoinRing(ctx, "example-shards", client.WithMember("worker-1")) // opens the session
	if err != nil {
		log.Fatal(err)
	}
	defer ring.Close()
	for gained := 0; gained < 4; {
		if ch := <-ring.Changes(); ch.Kind == client.Gained {
			gained++
		}
	}
	tok, owned := ring.Owns("2") // from memory: no call
	fmt.Println(owned, tok.Lease)
	if _, err := c.Put(ctx, tok, "shards/2/state", []byte("done")); err != nil { // fenced by the shard's token
		log.Fatal(err)
	}

	if err := ring.Leave(ctx); err != nil {
		log.Fatal(err)
	}
	for ch := range ring.Changes() { // closed once everything is handed off
		if ch.Kind == client.Losing { // stop acting for the shard, then let it go
			if _, err := ring.Release(ctx, ch.Shard); err != nil {
				log.Fatal(err)
			}
		}
	}
	fmt.Println(ring.Err())
	// Output:
	// true ring:example-shards:2
	// client: left the ring
}

// TestMain runs the examples against a real fencer serve: in a fencer
// checkout, it builds ../cmd/fencer from the root module, starts fencer
// serve on an embedded etcd in a temporary directory and a free port, and
// points FENCER_SERVER at it. Outside a checkout (the client module alone,
// as a dependency) the examples are skipped. The client module does not
// require the root module: the binary is built by the go command.
func TestMain(m *testing.M) {
	flag.Parse()
	if !inCheckout() {
		fmt.Println("client: not in a fencer checkout, so no fencer serve to run the examples against: examples skipped")
		if err := flag.Set("test.skip", "^Example"); err != nil {
			log.Fatal(err)
		}
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "fencer-client-example")
	if err != nil {
		log.Fatal(err)
	}
	stop, err := startServe(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		log.Fatal(err)
	}
	code := m.Run()
	stop()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// inCheckout reports whether the parent directory is fencer's root
// module with its binary's source.
func inCheckout() bool {
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(mod), "\n")
	_, err = os.Stat(filepath.Join("..", "cmd", "fencer", "main.go"))
	return strings.TrimSpace(first) == "module github.com/fencer-dev/fencer" && err == nil
}

// startServe builds fencer into dir and runs fencer serve with its data in
// dir until stop is called, once the server reports SERVING health.
func startServe(dir string) (stop func(), err error) {
	bin := filepath.Join(dir, "fencer")
	bctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(bctx, "go", "build", "-o", bin, "./cmd/fencer")
	build.Dir = ".."
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build fencer: %w\n%s", err, out)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var logs strings.Builder
	serve := exec.Command(bin, "serve", "--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "data"))
	serve.Stdout, serve.Stderr = &logs, &logs
	if err := serve.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	stop = func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = serve.Process.Kill()
			<-exited
		}
	}
	if err := awaitServing(addr, exited); err != nil {
		stop()
		return nil, fmt.Errorf("fencer serve: %w\n%s", err, logs.String())
	}
	if err := os.Setenv("FENCER_SERVER", addr); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// freeAddr returns a loopback address with a port that was free.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// awaitServing waits up to a minute for the server at addr to report
// SERVING health, and fails at once if it exits.
func awaitServing(addr string, exited <-chan error) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("not serving after a minute: %w", err)
		case <-tick.C:
		}
	}
}
