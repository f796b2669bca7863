// Package faultproxy is a TCP proxy that injects network faults between a
// client and a server on loopback, for fencer's tests:
//
//   - Freeze and Pause hold every byte in flight and deliver it, late, when
//     the pause ends, as a paused process or a stalled network would;
//   - Isolate cuts the connections of chosen sources (or of all) and refuses
//     their new ones until Heal: a partition that heals;
//   - Cut stops the proxy for good.
//
// A proxy tells sources apart only if it was given WithSource.
package faultproxy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target.
//
// Invariants:
//   - gate is held for writing exactly while paused > 0 and the proxy is
//     not cut; pipes take it for reading around each delivery, so a pause
//     holds every byte not yet delivered. pauseMu orders the changes.
//   - every live connection pair is in conns under the source it was
//     accepted from, and a source in blocked (or every source, while all is
//     set) has no live connection.
type Proxy struct {
	ln     net.Listener
	target string
	source func(conn net.Conn) string
	gate   sync.RWMutex

	pauseMu sync.Mutex
	paused  int

	mu      sync.Mutex
	all     bool
	blocked map[string]bool
	conns   map[*pair]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// pair is one proxied connection: the accepted one and the one to the
// target.
type pair struct {
	src       string
	down, up  net.Conn
	closeOnce sync.Once
	remaining int // pipes still running, under Proxy.mu
}

func (c *pair) close() {
	c.closeOnce.Do(func() {
		c.down.Close()
		c.up.Close()
	})
}

// Option configures a Proxy.
type Option func(*Proxy)

// WithSource names the source of each accepted connection (from its
// addresses, for example), so that Isolate can cut some sources and not
// others. It is called once per connection, before anything is forwarded;
// "" names an unknown source.
func WithSource(f func(conn net.Conn) string) Option {
	return func(p *Proxy) { p.source = f }
}

// TB is the part of testing.TB that New uses, so that fencertest.TB
// serves as well.
type TB interface {
	Helper()
	Cleanup(f func())
	Fatalf(format string, args ...any)
}

// New starts a proxy to target ("host:port") that is cut when tb ends.
func New(tb TB, target string, opts ...Option) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, blocked: map[string]bool{}, conns: map[*pair]struct{}{}}
	for _, o := range opts {
		o(p)
	}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(p.Cut)
	return p
}

// Addr returns the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Endpoint returns the proxy's address as an http URL, the form etcd
// clients take.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

// Freeze stops delivery in both directions for d and returns at once.
// What is sent meanwhile is delivered, late, when d has passed.
func (p *Proxy) Freeze(d time.Duration) {
	p.Pause()
	time.AfterFunc(d, p.Resume)
}

// Pause stops delivery in both directions until the matching Resume; what
// is sent meanwhile is held, not dropped. Pauses nest. Pause waits for a
// delivery under way to finish.
func (p *Proxy) Pause() {
	p.pauseMu.Lock()
	defer p.pauseMu.Unlock()
	if p.isClosed() {
		return
	}
	if p.paused++; p.paused == 1 {
		p.gate.Lock()
	}
}

// Resume ends one Pause; when the last one ends, everything held is
// delivered. A Resume without a Pause does nothing.
func (p *Proxy) Resume() {
	p.pauseMu.Lock()
	defer p.pauseMu.Unlock()
	if p.paused == 0 {
		return
	}
	if p.paused--; p.paused == 0 {
		p.gate.Unlock()
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Isolate closes the connections from the sources named, and refuses their
// new ones, until Heal. With no source named, it isolates every source: the
// target is partitioned from all its clients. Bytes still held by a pause
// on those connections are dropped.
func (p *Proxy) Isolate(sources ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(sources) == 0 {
		p.all = true
	}
	for _, s := range sources {
		p.blocked[s] = true
	}
	for c := range p.conns {
		if p.isBlocked(c.src) {
			c.close()
		}
	}
}

// Heal ends every isolation: new connections are accepted from any source.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = false
	clear(p.blocked)
}

func (p *Proxy) isBlocked(src string) bool { return p.all || p.blocked[src] }

// Cut closes the listener and every connection: the client is partitioned
// from the target, which keeps running. Cut is idempotent, ends any pause,
// and waits for the proxy's goroutines to end.
func (p *Proxy) Cut() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.pauseMu.Lock()
	if p.paused > 0 {
		p.paused = 0
		p.gate.Unlock()
	}
	p.pauseMu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		var src string
		if p.source != nil {
			src = p.source(down)
		}
		p.mu.Lock()
		refuse := p.closed || p.isBlocked(src)
		p.mu.Unlock()
		if refuse {
			down.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		c := &pair{src: src, down: down, up: up, remaining: 2}
		p.mu.Lock()
		if p.closed || p.isBlocked(src) {
			p.mu.Unlock()
			c.close()
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up, down)
		go p.pipe(c, down, up)
	}
}

func (p *Proxy) pipe(c *pair, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		c.close()
		p.mu.Lock()
		if c.remaining--; c.remaining == 0 {
			delete(p.conns, c)
		}
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate.RLock()
			_, werr := dst.Write(buf[:n])
			p.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
