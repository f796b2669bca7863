package server_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

// awaitHealth reads w until it reports want.
func awaitHealth(t *testing.T, w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for {
		resp, err := w.Recv()
		require.NoError(t, err)
		if resp.GetStatus() == want {
			return
		}
	}
}

// probe returns the HTTP status of srv's health endpoint path.
func probe(srv *server.Server, path string) int {
	rec := httptest.NewRecorder()
	srv.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// TestHealthFollowsEtcd puts a proxy between the server and its etcd
// member. While the proxy holds every byte, gRPC health, /readyz and
// fencer_etcd_up say NOT_SERVING; when it lets them through, SERVING
// again. /healthz (liveness) stays up throughout. The probes carry no
// bearer token.
func TestHealthFollowsEtcd(t *testing.T) {
	member := fencertest.Etcd(t)
	proxy := faultproxy.New(t, member.Endpoint()[len("http://"):])
	st := fencertest.StoreOn(t, []string{proxy.Endpoint()})
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, srv := serve(t, server.Config{Store: st, Authenticator: auth, ReadinessInterval: 100 * time.Millisecond})
	ctx := fencertest.Context(t)
	w, err := healthpb.NewHealthClient(dial(t, "", addr)).Watch(ctx, &healthpb.HealthCheckRequest{Service: fencerv1.FencerService_ServiceDesc.ServiceName})
	require.NoError(t, err)

	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
	require.Equal(t, http.StatusOK, probe(srv, "/readyz"))
	require.Equal(t, 1.0, scrape(t, srv, "fencer_etcd_up"))

	proxy.Pause()
	awaitHealth(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
	require.Equal(t, http.StatusServiceUnavailable, probe(srv, "/readyz"))
	require.Equal(t, http.StatusOK, probe(srv, "/healthz"))
	require.Equal(t, 0.0, scrape(t, srv, "fencer_etcd_up"))

	proxy.Resume()
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
	require.Equal(t, http.StatusOK, probe(srv, "/readyz"))
	require.Equal(t, 1.0, scrape(t, srv, "fencer_etcd_up"))
}

// TestHealthWithoutEtcd starts a server whose etcd endpoint has nothing
// behind it: it never reports SERVING.
func TestHealthWithoutEtcd(t *testing.T) {
	member := fencertest.Etcd(t)
	proxy := faultproxy.New(t, member.Endpoint()[len("http://"):])
	proxy.Pause()
	defer proxy.Resume()
	st := fencertest.StoreOn(t, []string{proxy.Endpoint()})
	rec := newRecorder()
	addr, srv := serve(t, server.Config{Store: st, Authenticator: server.Anonymous("a"), ReadinessInterval: 100 * time.Millisecond, Logger: slog.New(rec)})
	ctx := fencertest.Context(t)
	w, err := healthpb.NewHealthClient(dial(t, "", addr)).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	first, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, first.GetStatus())
	// A failed check takes its 2 s timeout; wait for its log record.
	unreachable := func(m map[string]any) bool { return m["msg"] == "etcd unreachable: not serving" }
	require.Eventually(t, func() bool { return len(rec.find(unreachable)) > 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, slog.LevelWarn, rec.find(unreachable)[0]["level"])
	require.Equal(t, 0.0, scrape(t, srv, "fencer_etcd_up"))
	require.Equal(t, http.StatusServiceUnavailable, probe(srv, "/readyz"))
	require.Equal(t, http.StatusOK, probe(srv, "/healthz"))
	resp, err := healthpb.NewHealthClient(dial(t, "", addr)).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, resp.GetStatus())
}

// TestProbesNeedNoCredentials calls health and reflection without a
// bearer token on a server that requires one for everything else.
func TestProbesNeedNoCredentials(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	cc := dial(t, "", addr)

	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	awaitHealth(t, w, healthpb.HealthCheckResponse_SERVING)
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: fencerv1.FencerService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())

	refl, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	list, err := refl.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range list.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	require.Contains(t, names, fencerv1.FencerService_ServiceDesc.ServiceName)
	require.NoError(t, refl.CloseSend())

	_, err = fencerv1.NewFencerServiceClient(cc).ListLeases(ctx, &fencerv1.ListLeasesRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
}
