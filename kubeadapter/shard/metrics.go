package shard

import (
	"fmt"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names of this package. A Sharder also counts its Lease writes in
// kubeadapter.MetricLeaseWrites (WriteAssign for each move, WriteTombstone
// for each tombstone) and its heartbeat renewals in kubeadapter's renewal
// metrics, through its Watcher.
const (
	// MetricOwned is a gauge: the shards this process's Sharder of the
	// ring (label ring) owns now.
	MetricOwned = "fencer_shards_owned"
	// MetricMoves counts the shard Lease writes of this process that
	// moved a shard, by reason: MoveCreate, MoveHandoff, MoveOrphan or
	// MoveRelease.
	MetricMoves = "fencer_shard_moves_total"
	// MetricHandoffForced counts handoffs written before in-flight work on
	// the shard drained, because Config.HandoffTimeout passed.
	MetricHandoffForced = "fencer_shard_handoff_forced_total"
	// MetricDispatchSkipped counts requests that Gate dropped because
	// this member did not own their shard.
	MetricDispatchSkipped = "fencer_shard_dispatch_skipped_total"
)

// Metrics are the collectors of this package's Metric constants, shared
// by every Sharder of a process that is given them (Config.Metrics): the
// ring label tells the rings apart. A nil *Metrics records nothing.
type Metrics struct {
	owned         *prometheus.GaugeVec
	moves         *prometheus.CounterVec
	handoffForced prometheus.Counter
	skipped       prometheus.Counter
}

// NewMetrics creates the collectors and registers them with reg. It
// returns a *kubeadapter.ConfigError for a nil reg, and the registerer's
// error, wrapped, when one of them is already registered there, as when
// NewMetrics is called twice with one registerer: create the Metrics once
// and give them to every Sharder.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, &kubeadapter.ConfigError{Field: "NewMetrics", Reason: "registerer must not be nil"}
	}
	m := &Metrics{
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricOwned,
			Help: "Shards of the ring this process owns now.",
		}, []string{"ring"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricMoves,
			Help: "Shard Lease writes of this process that moved a shard, by reason (create, handoff, orphan, release).",
		}, []string{"reason"}),
		handoffForced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricHandoffForced,
			Help: "Shard handoffs written before in-flight work drained, after the handoff timeout.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDispatchSkipped,
			Help: "Requests dropped at dispatch because this member did not own their shard.",
		}),
	}
	for _, c := range []prometheus.Collector{m.owned, m.moves, m.handoffForced, m.skipped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("shard: register metrics: %w", err)
		}
	}
	// Show every reason from the start, so that rate() works on the
	// first event.
	for _, r := range []string{MoveCreate, MoveHandoff, MoveOrphan, MoveRelease} {
		m.moves.WithLabelValues(r)
	}
	return m, nil
}

// moved records one shard move for reason.
func (m *Metrics) moved(reason string) {
	if m != nil {
		m.moves.WithLabelValues(reason).Inc()
	}
}

// setOwned sets the number of shards of ring this process owns.
func (m *Metrics) setOwned(ring string, n int) {
	if m != nil {
		m.owned.WithLabelValues(ring).Set(float64(n))
	}
}

// forced records a handoff written before its drain finished.
func (m *Metrics) forced() {
	if m != nil {
		m.handoffForced.Inc()
	}
}

// skip records a request dropped at dispatch.
func (m *Metrics) skip() {
	if m != nil {
		m.skipped.Inc()
	}
}
