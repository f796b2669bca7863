package server

import (
	"context"
	"errors"
	"net/http"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
)

// metrics are one Server's Prometheus metrics, in a registry of its own so
// that several servers can run in one process.
type metrics struct {
	reg          *prometheus.Registry
	grpc         *grpcprom.ServerMetrics // grpc_server_*: calls, codes, latency, messages
	sessions     prometheus.Counter
	acquisitions prometheus.Counter
	keepalives   prometheus.Counter
	keepFails    *prometheus.CounterVec
	lost         prometheus.Counter
	leasesLost   prometheus.Counter
	rejections   *prometheus.CounterVec
	manyPuts     *prometheus.CounterVec
	manyPutsOK   prometheus.Counter // manyPuts' OK series
	leaseWatches prometheus.Gauge
	etcdUp       prometheus.Gauge
	ringMembers  prometheus.Gauge
	ringOwned    prometheus.Gauge
	ringChanges  *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets(prometheus.ExponentialBuckets(0.0005, 2, 16)))),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencer_server_sessions_opened_total", Help: "Sessions opened (etcd leases granted).",
		}),
		acquisitions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencer_server_acquisitions_total", Help: "Leases acquired.",
		}),
		keepalives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencer_server_keepalives_total", Help: "Session renewals; one per session, not per lease.",
		}),
		keepFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencer_server_keepalive_failures_total", Help: "Session renewals that failed, by reason: expired (etcd no longer has the session) or etcd (etcd did not renew it: unreachable, no leader, timeout).",
		}, []string{"reason"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencer_server_lease_lost_events_total", Help: "LOST events sent to lease watchers.",
		}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencer_server_leases_lost_total", Help: "Leases lost (holder key deleted or replaced, not released through this server), once per loss as this server's holder-key watch sees it, whether or not a stream watches.",
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencer_server_rejected_writes_total", Help: "Guarded operations rejected, by reason (stale, foreign_lease, permission).",
		}, []string{"reason"}),
		manyPuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencer_server_put_many_puts_total", Help: "Puts of PutMany calls, by the gRPC code each ended with (grpc_server_handled_total counts the calls).",
		}, []string{"grpc_code"}),
		leaseWatches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fencer_server_lease_watches", Help: "etcd watches on the holder keys feeding WatchLease streams: the shared one, plus one per stream still catching up.",
		}),
		etcdUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fencer_etcd_up", Help: "1 while the last readiness check found etcd answering linearizable reads, else 0.",
		}),
		ringMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fencer_server_ring_members", Help: "Ring members whose JoinRing stream this server runs.",
		}),
		ringOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fencer_server_ring_shards_owned", Help: "Shards owned by the ring members whose JoinRing stream this server runs.",
		}),
		ringChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencer_server_ring_shard_changes_total", Help: "Shard changes reported to this server's JoinRing streams, by kind: gained, losing (a hand-off started), lost (handed off or ended otherwise).",
		}, []string{"kind"}),
	}
	m.reg.MustRegister(m.grpc, m.sessions, m.acquisitions, m.keepalives, m.keepFails, m.lost, m.leasesLost, m.rejections, m.manyPuts, m.leaseWatches, m.etcdUp,
		m.ringMembers, m.ringOwned, m.ringChanges,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, kind := range []string{ringGained, ringLosing, ringLost} {
		m.ringChanges.WithLabelValues(kind) // present at 0, for rates
	}
	m.manyPutsOK = m.manyPuts.WithLabelValues(codes.OK.String())
	for _, reason := range []string{keepAliveExpired, keepAliveEtcd} {
		m.keepFails.WithLabelValues(reason) // present at 0, for rates and ratios
	}
	return m
}

// The kinds of fencer_server_ring_shard_changes_total.
const (
	ringGained = "gained"
	ringLosing = "losing"
	ringLost   = "lost"
)

// The reasons of fencer_server_keepalive_failures_total.
const (
	keepAliveExpired = "expired"
	keepAliveEtcd    = "etcd"
)

// keepAliveFailed counts a failed renewal, unless its caller gave up (err
// is its context's).
func (m *metrics) keepAliveFailed(ctx context.Context, err error) {
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, rpctypes.ErrLeaseNotFound), errors.Is(err, ErrSessionNotFound):
		m.keepFails.WithLabelValues(keepAliveExpired).Inc()
	default:
		m.keepFails.WithLabelValues(keepAliveEtcd).Inc()
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
