package integration_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// freezeProxy forwards TCP connections to a target. Freeze holds every byte
// in flight for a while, in both directions, and then delivers it: to the
// store, a frozen client looks like a process paused by GC or a network
// that stalls, and its requests arrive late.
type freezeProxy struct {
	ln     net.Listener
	target string
	gate   sync.RWMutex // held for writing while frozen

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezeProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) addr() string { return p.ln.Addr().String() }

// freeze stops delivery for d and returns at once.
func (p *freezeProxy) freeze(d time.Duration) {
	p.gate.Lock()
	time.AfterFunc(d, p.gate.Unlock)
}

func (p *freezeProxy) serve() {
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

func (p *freezeProxy) pipe(dst, src net.Conn) {
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

func (p *freezeProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
