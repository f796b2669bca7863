// Package freeport picks loopback TCP ports for servers that fencer's
// tests and embedded members start as separate listeners or processes.
//
// It owns one rule: a port is chosen at random below the kernel's default
// ephemeral range (32768-60999), so that the outgoing connections of this
// and other processes, which take ports from that range, cannot take it
// between the choice and the server's bind, and every port of one call is
// held by a listener until the caller releases them, so that no port is
// handed out twice. It cannot stop an unrelated process from binding the
// same port on purpose.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// ErrNoPort reports that no free loopback port was found.
var ErrNoPort = errors.New("freeport: no free loopback port")

const lo, hi = 20000, 32768

// Take returns n distinct loopback ports that are free, each held by a
// listener until release is called. Call release just before the servers
// bind. On error nothing is held.
func Take(n int) (ports []int, release func(), err error) {
	ls := make([]net.Listener, 0, n)
	release = func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for range n {
		l, err := listen()
		if err != nil {
			release()
			return nil, func() {}, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, release, nil
}

func listen() (net.Listener, error) {
	var err error
	for range 100 {
		var l net.Listener
		l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo))))
		if err == nil {
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w: %v", ErrNoPort, err)
}
