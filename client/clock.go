package client

import "time"

// Clock is the time source of a Client's sessions: it paces keepalives and
// measures their local deadlines on the monotonic clock. It has the shape
// of k8s.io/utils/clock's Clock, declared here so that a gRPC user's module
// graph holds no k8s.io module; a fake for tests needs only these methods.
type Clock interface {
	// Now returns the current time, with a monotonic reading.
	Now() time.Time
	// NewTimer returns a Timer that fires once d has passed.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's one-shot timer, with time.Timer's contract.
type Timer interface {
	// C returns the channel on which the timer fires.
	C() <-chan time.Time
	// Stop stops the timer, as time.Timer.Stop does.
	Stop() bool
	// Reset makes the timer fire after d, as time.Timer.Reset does.
	Reset(d time.Duration) bool
}

// realClock is the Clock of a Client built without WithClock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{t: time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }

func (r realTimer) Stop() bool { return r.t.Stop() }

func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
