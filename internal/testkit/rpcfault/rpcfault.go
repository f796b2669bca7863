// Package rpcfault counts a gRPC client's calls and can fail them all at
// once for a while, for fencer's tests of what its retry loops cost while
// etcd (or a fencer server) is unavailable.
//
// Its interceptors sit inside any the client already has, so that with an
// etcd client every attempt is counted, including those the client library
// retries by itself.
package rpcfault

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
)

// Injector counts calls while counting is on and, while an outage is on,
// fails every new call at once with the outage's error and breaks every
// stream that is open when the outage starts. Its methods are safe for
// concurrent use.
type Injector struct {
	mu       sync.Mutex
	counting bool
	calls    map[string]int
	outage   error           // nil when there is none
	only     map[string]bool // the methods the outage fails; nil: all
	open     map[*stream]struct{}
	sessions map[*sessionsStream]struct{} // the open Sessions streams; see sessionsStream
}

// New returns an Injector that is neither counting nor failing calls.
func New() *Injector {
	return &Injector{calls: map[string]int{}, open: map[*stream]struct{}{}, sessions: map[*sessionsStream]struct{}{}}
}

// DialOptions returns the options that put the injector into a client:
// pass them to grpc.NewClient, or as clientv3.Config.DialOptions.
func (in *Injector) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(in.unary), grpc.WithChainStreamInterceptor(in.stream)}
}

// Count starts counting calls from zero.
func (in *Injector) Count() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.counting = true
	clear(in.calls)
}

// Calls returns the number of calls counted by method ("/pkg.Service/Method").
func (in *Injector) Calls() map[string]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[string]int, len(in.calls))
	for m, n := range in.calls {
		out[m] = n
	}
	return out
}

// Total returns the number of calls counted.
func (in *Injector) Total() int {
	n := 0
	for _, c := range in.Calls() {
		n += c
	}
	return n
}

// Summary formats calls as "Method=n" pairs, by method name.
func Summary(calls map[string]int) string {
	var parts []string
	for m, n := range calls {
		parts = append(parts, m[strings.LastIndexByte(m, '/')+1:]+"="+strconv.Itoa(n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// Start begins an outage: every call from now on fails at once with err,
// and every stream open now fails its next receive with err. With
// methods ("/pkg.Service/Method"), only calls of those fail. fencer's
// Sessions streams go on through an outage of KeepAlive or WatchLease
// alone, which fails the renewals and watches on them instead (see
// sessionsStream).
func (in *Injector) Start(err error, methods ...string) {
	in.mu.Lock()
	in.outage, in.only = err, nil
	if len(methods) > 0 {
		in.only = map[string]bool{}
		for _, m := range methods {
			in.only[m] = true
		}
	}
	var broken []*stream
	for s := range in.open {
		if in.fails(s.method) {
			broken = append(broken, s)
			delete(in.open, s)
		}
	}
	var cut []*sessionsStream
	if !in.fails(sessionsMethod) {
		for s := range in.sessions {
			cut = append(cut, s)
		}
	}
	cutKeepAlive, cutWatch := in.fails(keepAliveMethod), in.fails(watchLeaseMethod)
	in.mu.Unlock()
	for _, s := range broken {
		s.fail(err)
	}
	for _, s := range cut {
		if cutKeepAlive {
			s.cut(keepAliveMethod, err)
		}
		if cutWatch {
			s.cut(watchLeaseMethod, err)
		}
	}
}

// forget drops a Sessions stream that has ended.
func (in *Injector) forget(s *sessionsStream) {
	in.mu.Lock()
	delete(in.sessions, s)
	in.mu.Unlock()
}

// fails reports whether the outage fails calls of method. in.mu must be
// held.
func (in *Injector) fails(method string) bool {
	return in.outage != nil && (in.only == nil || in.only[method])
}

// Stop ends the outage.
func (in *Injector) Stop() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.outage = nil
}

// call counts a call to method and returns the outage's error, if any.
func (in *Injector) call(method string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.counting {
		in.calls[method]++
	}
	if in.fails(method) {
		return in.outage
	}
	return nil
}

func (in *Injector) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := in.call(method); err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (in *Injector) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := in.call(method); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &stream{ClientStream: cs, in: in, method: method, cancel: cancel}
	var out grpc.ClientStream = s
	in.mu.Lock()
	if in.fails(method) { // started meanwhile
		err := in.outage
		in.mu.Unlock()
		s.fail(err)
		return s, nil
	}
	in.open[s] = struct{}{}
	if method == sessionsMethod {
		ss := newSessionsStream(s)
		in.sessions[ss] = struct{}{}
		out = ss
	}
	in.mu.Unlock()
	return out, nil
}

// stream is an open stream that an outage can break.
type stream struct {
	grpc.ClientStream
	in     *Injector
	method string
	cancel context.CancelFunc

	mu  sync.Mutex
	err error // the outage's, once broken
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	s.cancel()
}

// RecvMsg receives from the stream, or fails with the outage's error once
// the stream has been broken by one.
func (s *stream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		return nil
	}
	s.cancel()
	s.in.mu.Lock()
	delete(s.in.open, s)
	s.in.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	return err
}
