// Package watcherr wraps a Kubernetes watch so that its Error events are
// reported to the caller: client-go's reflector turns such an event into a
// relist without telling anyone, and kubeadapter's Watcher counts and logs
// each one.
//
// It is written here, not taken from apimachinery's watch.Filter, because
// Filter's forwarding goroutine blocks forever on a send once its reader
// has stopped reading after Stop; Report's goroutine ends at Stop, so no
// goroutine outlives a watch (the Kubernetes module's tests check for
// leaked goroutines). It imports the standard library and apimachinery
// only.
package watcherr

import (
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
)

// Report returns a watch that passes on every event of in, in order, and
// calls report with the error of each Error event before passing it on.
// Its Stop stops in and the forwarding, and its result channel is closed
// when in's is or at Stop. report is called from the forwarding
// goroutine, one call at a time.
func Report(in watch.Interface, report func(error)) watch.Interface {
	c := &reporting{in: in, out: make(chan watch.Event), stop: make(chan struct{}), report: report}
	go c.loop()
	return c
}

type reporting struct {
	in     watch.Interface
	out    chan watch.Event
	stop   chan struct{}
	once   sync.Once
	report func(error)
}

func (c *reporting) loop() {
	defer close(c.out)
	for {
		var ev watch.Event
		var ok bool
		select {
		case ev, ok = <-c.in.ResultChan():
			if !ok {
				return
			}
		case <-c.stop:
			return
		}
		if ev.Type == watch.Error {
			c.report(apierrors.FromObject(ev.Object))
		}
		select {
		case c.out <- ev:
		case <-c.stop:
			return
		}
	}
}

// ResultChan returns the events of the underlying watch.
func (c *reporting) ResultChan() <-chan watch.Event { return c.out }

// Stop stops the underlying watch and the forwarding.
func (c *reporting) Stop() {
	c.once.Do(func() { close(c.stop) })
	c.in.Stop()
}
