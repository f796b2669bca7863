package kubeadapter

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names. The lease label is the Lease's "namespace/name"; the reason
// label is one of ReasonDeleted, ReasonReplaced, ReasonTaken and
// ReasonRenewDeadline.
const (
	// MetricLeader is a gauge: the number of acquisitions of the lease
	// this process holds now (0 or 1, 2 only while two Electors of one
	// process overlap on one Lease).
	MetricLeader = "fencer_lease_leader"
	// MetricTransitions counts the acquisitions of a Lease that the
	// Watcher observed, by any holder: a change of holder to a non-empty
	// one, a change of leaseTransitions, or a creation naming a holder.
	MetricTransitions = "fencer_lease_transitions_total"
	// MetricSelfFence counts the acquisitions of this process that ended
	// other than by Release, by reason.
	MetricSelfFence = "fencer_self_fence_total"
	// MetricSelfFenceLatency is a histogram of the time from the Watcher
	// receiving the Lease event that shows a loss to the held
	// acquisition's context being cancelled, in seconds.
	MetricSelfFenceLatency = "fencer_self_fence_latency_seconds"
	// MetricRenewals counts successful renewal writes.
	MetricRenewals = "fencer_lease_renewals_total"
	// MetricRenewalFailures counts renewal writes that failed, for any
	// reason (API error, conflict, Lease gone).
	MetricRenewalFailures = "fencer_lease_renewal_failures_total"
	// MetricWatchErrors counts the Watcher's failed lists and watches, by
	// kind: WatchExpired (its resourceVersion was too old; it lists again
	// at once) or WatchFailed (any other error; it retries with backoff).
	// While they fail the Watcher may see a loss late; renewals still fail
	// closed at RenewDeadline.
	MetricWatchErrors = "fencer_lease_watch_errors_total"
	// MetricAcquireErrors counts an Elector's failed acquisition attempts,
	// by lease and reason (the Acquire* constants). An attempt that finds
	// the lease held by another is not an error and is not counted.
	MetricAcquireErrors = "fencer_lease_acquire_errors_total"
	// MetricLeaseWrites counts the Lease writes this process made that
	// the API server accepted, by kind: WriteRenew (a heartbeat or
	// leader renewal), WriteAssign (an acquisition, or a shard Lease
	// create, handoff, takeover or release) and WriteTombstone (a release
	// of a heartbeat or leader Lease, or a dead member's tombstone). Its
	// rate summed over a cluster is the renewal load on the API server.
	// Writes made outside this package (a shard.Sharder's) are counted
	// through Watcher.RecordLeaseWrite.
	MetricLeaseWrites = "fencer_lease_writes_total"
)

// Values of the kind label of MetricLeaseWrites.
const (
	WriteRenew     = "renew"
	WriteAssign    = "assign"
	WriteTombstone = "tombstone"
)

// Values of the reason label of MetricAcquireErrors. Acquire returns an
// *AcquireError at once for AcquireForbidden, AcquireInvalid and an
// AcquireNotFound that names the namespace, and retries the others.
const (
	// AcquireForbidden: the identity lacks the rights (RBAC or admission).
	AcquireForbidden = "forbidden"
	// AcquireNotFound: the namespace does not exist, or the Lease was
	// deleted during the attempt.
	AcquireNotFound = "not_found"
	// AcquireInvalid: the server finds the write invalid or malformed.
	AcquireInvalid = "invalid"
	// AcquireConflict: a concurrent candidate wrote the Lease first.
	AcquireConflict = "conflict"
	// AcquireUnauthorized: the server did not accept the credentials;
	// retried, since credentials are rotated in place.
	AcquireUnauthorized = "unauthorized"
	// AcquireThrottled: the server answered 429 Too Many Requests.
	AcquireThrottled = "throttled"
	// AcquireTimeout: the server or the client timed out.
	AcquireTimeout = "timeout"
	// AcquireUnavailable: the server failed (5xx) or could not be reached.
	AcquireUnavailable = "unavailable"
	// AcquireOther: any other error.
	AcquireOther = "other"
)

// Values of the kind label of MetricWatchErrors.
const (
	WatchExpired = "expired"
	WatchFailed  = "failed"
)

// Values of the reason label of MetricSelfFence.
const (
	ReasonDeleted       = "deleted"
	ReasonReplaced      = "replaced"
	ReasonTaken         = "taken"
	ReasonRenewDeadline = "renew_deadline"
)

// latencyBuckets spans 100µs to 2.5s: a watch event is normally handled
// within a millisecond; the upper buckets show a starved process.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5}

// metrics are the collectors of one Watcher. A nil *metrics records
// nothing, so that code paths without a registerer need no checks.
type metrics struct {
	leader          *prometheus.GaugeVec
	transitions     *prometheus.CounterVec
	selfFence       *prometheus.CounterVec
	latency         prometheus.Histogram
	renewals        *prometheus.CounterVec
	renewalFailures *prometheus.CounterVec
	watchErrors     *prometheus.CounterVec
	acquireErrors   *prometheus.CounterVec
	leaseWrites     *prometheus.CounterVec
}

// newMetrics creates the collectors and registers them with reg. It fails
// if any of them is already registered, as when two Watchers share a
// registerer.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricLeader,
			Help: "Acquisitions of the Lease this process holds now (0 or 1).",
		}, []string{"lease"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricTransitions,
			Help: "Acquisitions of the Lease by any holder observed by the watcher.",
		}, []string{"lease"}),
		selfFence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricSelfFence,
			Help: "Acquisitions of this process that ended other than by release, by reason.",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricSelfFenceLatency,
			Help:    "Time from the watcher receiving a Lease event that shows a loss to the holder's context being cancelled.",
			Buckets: latencyBuckets,
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRenewals,
			Help: "Successful Lease renewal writes.",
		}, []string{"lease"}),
		renewalFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRenewalFailures,
			Help: "Failed Lease renewal writes.",
		}, []string{"lease"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricWatchErrors,
			Help: "Failed Lease lists and watches of the watcher, by kind (expired: listed again; failed: retried with backoff).",
		}, []string{"kind"}),
		leaseWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricLeaseWrites,
			Help: "Lease writes of this process accepted by the API server, by kind (renew, assign, tombstone).",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.leader, m.transitions, m.selfFence, m.latency, m.renewals, m.renewalFailures, m.watchErrors, m.leaseWrites} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("kubeadapter: register metrics: %w", err)
		}
	}
	var err error
	if m.acquireErrors, err = registerAcquireErrors(reg); err != nil {
		return nil, err
	}
	// Show every reason from the start, so that rate() works on the
	// first event.
	for _, r := range []string{ReasonDeleted, ReasonReplaced, ReasonTaken, ReasonRenewDeadline} {
		m.selfFence.WithLabelValues(r)
	}
	for _, k := range []string{WatchExpired, WatchFailed} {
		m.watchErrors.WithLabelValues(k)
	}
	for _, k := range []string{WriteRenew, WriteAssign, WriteTombstone} {
		m.leaseWrites.WithLabelValues(k)
	}
	return m, nil
}

// registerAcquireErrors registers the MetricAcquireErrors counter with
// reg, or returns the one already registered there, so that Electors
// without a Watcher (Config.Registerer) and a Watcher's metrics can share
// a registerer.
func registerAcquireErrors(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAcquireErrors,
		Help: "Failed Lease acquisition attempts of an elector, by reason (held by another is not counted).",
	}, []string{"lease", "reason"})
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: register metrics: %w", err)
	}
	return c, nil
}

// watchError records a failed list or watch of the given kind.
func (m *metrics) watchError(kind string) {
	if m != nil {
		m.watchErrors.WithLabelValues(kind).Inc()
	}
}

// acquireError records a failed acquisition attempt of lease.
func (m *metrics) acquireError(lease, reason string) {
	if m != nil {
		m.acquireErrors.WithLabelValues(lease, reason).Inc()
	}
}

// acquired records the start of an acquisition of lease.
func (m *metrics) acquired(lease string) {
	if m != nil {
		m.leader.WithLabelValues(lease).Inc()
	}
}

// ended records the end of an acquisition of lease for reason.
func (m *metrics) ended(lease string, reason error) {
	if m == nil {
		return
	}
	m.leader.WithLabelValues(lease).Dec()
	if label := reasonLabel(reason); label != "" {
		m.selfFence.WithLabelValues(label).Inc()
	}
}

// fenced records the time from a watch event's arrival to the
// cancellation it caused.
func (m *metrics) fenced(d time.Duration) {
	if m != nil {
		m.latency.Observe(d.Seconds())
	}
}

// transition records an observed acquisition of lease.
func (m *metrics) transition(lease string) {
	if m != nil {
		m.transitions.WithLabelValues(lease).Inc()
	}
}

// renewal records the outcome of one renewal write of lease.
func (m *metrics) renewal(lease string, ok bool) {
	switch {
	case m == nil:
	case ok:
		m.renewals.WithLabelValues(lease).Inc()
		m.leaseWrites.WithLabelValues(WriteRenew).Inc()
	default:
		m.renewalFailures.WithLabelValues(lease).Inc()
	}
}

// wrote records one accepted Lease write of kind.
func (m *metrics) wrote(kind string) {
	if m != nil {
		m.leaseWrites.WithLabelValues(kind).Inc()
	}
}

// reasonLabel maps a reason sentinel to its label value, or "" for
// ErrReleased, which is not a self-fence.
func reasonLabel(reason error) string {
	switch {
	case errors.Is(reason, ErrLeaseDeleted):
		return ReasonDeleted
	case errors.Is(reason, ErrLeaseReplaced):
		return ReasonReplaced
	case errors.Is(reason, ErrLeaseTaken):
		return ReasonTaken
	case errors.Is(reason, ErrRenewDeadline):
		return ReasonRenewDeadline
	}
	return ""
}
