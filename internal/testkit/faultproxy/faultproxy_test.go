package faultproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a line echo server that stops when t ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// roundTrip sends a line on c and reads the echo, within d.
func roundTrip(c net.Conn, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestPauseHoldsBytesUntilResume(t *testing.T) {
	p := faultproxy.New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = roundTrip(c, 5*time.Second)
	require.NoError(t, err)

	p.Pause()
	p.Pause() // pauses nest
	got := make(chan string, 1)
	go func() {
		s, _ := roundTrip(c, 10*time.Second)
		got <- s
	}()
	p.Resume()
	select {
	case s := <-got:
		t.Fatalf("delivered while paused: %q", s)
	case <-time.After(300 * time.Millisecond):
	}
	p.Resume()
	select {
	case s := <-got:
		require.Equal(t, "ping\n", s, "held bytes are delivered, not dropped")
	case <-time.After(5 * time.Second):
		t.Fatal("not delivered after Resume")
	}
	p.Resume() // unmatched: does nothing
}

func TestCutEndsAPause(t *testing.T) {
	p := faultproxy.New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	p.Pause()
	_, _ = c.Write([]byte("ping\n"))
	cut := make(chan struct{})
	go func() { p.Cut(); close(cut) }()
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("Cut hangs on a paused proxy")
	}
	p.Pause() // after Cut: does nothing
	p.Resume()
}

func TestIsolateCutsChosenSources(t *testing.T) {
	// Name each connection by the client's local port, which the test
	// chooses.
	la, err := net.Listen("tcp", "127.0.0.1:0") // reserve a port for a
	require.NoError(t, err)
	portA := la.Addr().(*net.TCPAddr).Port
	la.Close()
	p := faultproxy.New(t, echo(t), faultproxy.WithSource(func(c net.Conn) string {
		if c.RemoteAddr().(*net.TCPAddr).Port == portA {
			return "a"
		}
		return "b"
	}))
	dialFrom := func(port int) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
		return d.Dial("tcp", p.Addr())
	}
	a, err := dialFrom(portA)
	require.NoError(t, err)
	defer a.Close()
	b, err := dialFrom(0)
	require.NoError(t, err)
	defer b.Close()
	for _, c := range []net.Conn{a, b} {
		_, err := roundTrip(c, 5*time.Second)
		require.NoError(t, err)
	}

	p.Isolate("a")
	_, err = roundTrip(a, 2*time.Second)
	require.Error(t, err, "a's connection survived its isolation")
	_, err = roundTrip(b, 5*time.Second)
	require.NoError(t, err, "b was cut with a")

	p.Isolate()
	_, err = roundTrip(b, 2*time.Second)
	require.Error(t, err, "isolating every source left b connected")
	c, err := dialFrom(0)
	require.NoError(t, err) // the listener accepts, then closes
	_, err = roundTrip(c, 2*time.Second)
	require.Error(t, err, "a new connection was served while isolated")
	c.Close()

	p.Heal()
	c, err = dialFrom(0)
	require.NoError(t, err)
	defer c.Close()
	_, err = roundTrip(c, 5*time.Second)
	require.NoError(t, err, "not served after Heal")
}
