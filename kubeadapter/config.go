package kubeadapter

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
)

// JitterFactor scales Config.RetryPeriod into the longest wait between two
// acquisition attempts (RetryPeriod plus up to JitterFactor*RetryPeriod),
// as in client-go's leader election.
const JitterFactor = 1.2

// Config configures an Elector. Fields depend on each other, so NewElector
// checks them with Validate. DefaultConfig fills the durations with
// client-go's defaults.
type Config struct {
	// Namespace and Name name the coordination.k8s.io/v1 Lease.
	Namespace string
	Name      string
	// Identity is the configured holder name, such as a pod name. The
	// Elector writes Identity + "_" + a random nonce as holderIdentity, so
	// every process (every Elector) is a distinct holder.
	Identity string
	// LeaseDuration is how long other candidates wait, after last
	// observing a change to the record, before they take the Lease over.
	// It is written to the Lease in whole seconds, so it must be a whole
	// number of seconds.
	LeaseDuration time.Duration
	// RenewDeadline is how long a holder keeps the lease after the start
	// of its last successful acquiring or renewing write. When no renewal
	// succeeds within it, the Held ends (fail closed). It must be less
	// than LeaseDuration, so that a holder gives up before any other
	// candidate may take over.
	RenewDeadline time.Duration
	// RetryPeriod is the interval between renewals and, with jitter,
	// between acquisition attempts. RenewDeadline must exceed
	// JitterFactor*RetryPeriod.
	RetryPeriod time.Duration
	// Clock measures durations. Nil means the real clock. Only durations
	// between readings of this clock matter; the timestamps in the Lease
	// record are written for people and for client-go, and never read.
	Clock clock.WithDelayedExecution
	// Labels are set on the Lease, beside FenceLabel, by every acquiring
	// write; renewals and releases leave labels as they are. A Sharder
	// uses them to mark its members' heartbeat Leases.
	Labels map[string]string
	// Watcher, when set, ends each acquisition as soon as it sees the
	// Lease deleted, replaced or taken, instead of at the next renewal,
	// and receives the Elector's metrics. It must watch Namespace. Nil
	// means that loss is detected by renewals only.
	Watcher *Watcher
	// Registerer, when set, is where an Elector without a Watcher counts
	// MetricAcquireErrors (with a Watcher, the Watcher's WithRegisterer
	// counts them, and Registerer must be nil). Electors, and a Watcher's
	// metrics, may share one registerer: the counter is registered once
	// and shared. It records nothing else: renewals, self-fences and the
	// other Metric constants need a Watcher.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a Config for the Lease namespace/name and the
// configured identity with client-go's default durations: LeaseDuration
// 15s, RenewDeadline 10s, RetryPeriod 2s.
func DefaultConfig(namespace, name, identity string) Config {
	return Config{
		Namespace:     namespace,
		Name:          name,
		Identity:      identity,
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	}
}

// Validate reports the first invalid field as a *ConfigError, or nil. It
// applies client-go's rules (LeaseDuration > RenewDeadline >
// JitterFactor*RetryPeriod > 0) plus fencer's own: whole-second
// LeaseDuration, names that the API server accepts, and a Watcher that
// watches Namespace.
func (c Config) Validate() error {
	switch {
	case len(validation.IsDNS1123Label(c.Namespace)) > 0:
		return &ConfigError{Field: "Namespace", Reason: "must be a DNS-1123 label: " + strings.Join(validation.IsDNS1123Label(c.Namespace), "; ")}
	case len(validation.IsDNS1123Subdomain(c.Name)) > 0:
		return &ConfigError{Field: "Name", Reason: "must be a DNS-1123 subdomain: " + strings.Join(validation.IsDNS1123Subdomain(c.Name), "; ")}
	case c.Identity == "":
		return &ConfigError{Field: "Identity", Reason: "must not be empty"}
	case c.LeaseDuration < time.Second:
		return &ConfigError{Field: "LeaseDuration", Reason: "must be at least 1s"}
	case c.LeaseDuration%time.Second != 0:
		return &ConfigError{Field: "LeaseDuration", Reason: "must be a whole number of seconds"}
	case c.RenewDeadline <= 0:
		return &ConfigError{Field: "RenewDeadline", Reason: "must be positive"}
	case c.RetryPeriod <= 0:
		return &ConfigError{Field: "RetryPeriod", Reason: "must be positive"}
	case c.LeaseDuration <= c.RenewDeadline:
		return &ConfigError{Field: "RenewDeadline", Reason: "must be less than LeaseDuration"}
	case c.RenewDeadline <= time.Duration(JitterFactor*float64(c.RetryPeriod)):
		return &ConfigError{Field: "RetryPeriod", Reason: "times JitterFactor must be less than RenewDeadline"}
	case invalidLabels(c.Labels) != "":
		return &ConfigError{Field: "Labels", Reason: invalidLabels(c.Labels)}
	case c.Watcher != nil && c.Registerer != nil:
		return &ConfigError{Field: "Registerer", Reason: "must be nil when Watcher is set: the Watcher's metrics count acquire errors"}
	case c.Watcher != nil && !c.Watcher.watches(c.Namespace):
		return &ConfigError{Field: "Watcher", Reason: "does not watch namespace " + c.Namespace}
	}
	return nil
}

// lease is the Lease's "namespace/name", the Lease field of its tokens.
func (c Config) lease() string { return c.Namespace + "/" + c.Name }

// invalidLabels says what is wrong with the first invalid label, or "".
func invalidLabels(labels map[string]string) string {
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Sprintf("key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Sprintf("value %q of %q: %s", v, k, strings.Join(errs, "; "))
		}
	}
	return ""
}
