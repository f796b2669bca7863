package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// DefaultReadinessInterval is how often a server checks that etcd answers,
// unless Config.ReadinessInterval says otherwise.
const DefaultReadinessInterval = 5 * time.Second

// readinessTimeout bounds one readiness check.
const readinessTimeout = 2 * time.Second

// readiness checks etcd every interval until Shutdown and sets the
// server's health from the result: SERVING while a linearizable read
// (which needs an etcd leader and a quorum) answers within
// readinessTimeout, NOT_SERVING otherwise. It checks once at once. A
// check that passes also (re)starts the lease hub's shared watch if none
// runs, so that every loss is recorded.
func (s *Server) readiness(interval time.Duration) {
	defer close(s.readyDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stopped.Done()
		cancel()
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rev, err := s.checkEtcd(ctx)
		if err == nil {
			// Losses are recorded whether or not a stream watches.
			s.hub.keepShared(rev)
		}
		s.setReady(err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEtcd reads one key linearizably, requiring a leader, and returns
// the store's revision.
func (s *Server) checkEtcd(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(etcdContext(ctx), readinessTimeout)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.store.Prefix()+"readyz", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// setReady records the result of a readiness check: health, the
// fencer_etcd_up gauge, and a log record when it changes.
func (s *Server) setReady(err error) {
	up := err == nil
	changed := s.ready.Swap(up) != up || !s.checked.Swap(true)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if up {
		st = healthpb.HealthCheckResponse_SERVING
		s.m.etcdUp.Set(1)
	} else {
		s.m.etcdUp.Set(0)
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(fencerv1.FencerService_ServiceDesc.ServiceName, st)
	switch {
	case changed && up:
		s.log.Info("etcd reachable: serving")
	case changed:
		s.log.Warn("etcd unreachable: not serving", "err", err)
	}
}

// HealthHandler serves HTTP probes, without authentication: /healthz
// (liveness) answers 200 while the process serves HTTP at all; /readyz
// (readiness) answers 200 while the last etcd check passed and the server
// is not shutting down, 503 otherwise. Readiness is the gRPC health
// status, checked every Config.ReadinessInterval; neither probe calls
// etcd itself.
func (s *Server) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.stopping():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !s.ready.Load():
			http.Error(w, "etcd unreachable", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	return mux
}

func (s *Server) stopping() bool {
	select {
	case <-s.stopped.Done():
		return true
	default:
		return false
	}
}

// public reports whether a method is served without authentication: gRPC
// health and server reflection, which probes and tools call without
// credentials. They reveal no lease, key or principal; reflection reveals
// only the public API's schema.
func public(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}
