// Package faultproxy is a TCP proxy that injects network faults between a
// client and a server on loopback, for fencer's tests: Cut partitions them,
// Freeze holds every byte in flight for a while and then delivers it, as a
// paused process or a stalled network would.
package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections from a loopback port to a target.
type Proxy struct {
	ln     net.Listener
	target string
	gate   sync.RWMutex // held for writing while frozen

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// New starts a proxy to target ("host:port") that is cut when tb ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	p := &Proxy{ln: ln, target: target}
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
	p.gate.Lock()
	time.AfterFunc(d, p.gate.Unlock)
}

// Cut closes the listener and every connection: the client is partitioned
// from the target, which keeps running. Cut is idempotent and waits for the
// proxy's goroutines to end.
func (p *Proxy) Cut() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
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
