package main

import (
	"net"
	"strings"

	"google.golang.org/grpc/resolver"
)

// staticResolver resolves "fencer:///host:port,host:port" to those
// addresses, so that --server can name several servers. Each address
// carries its host as the server name that TLS verifies, since the
// target's authority names no single server.
type staticResolver struct{}

func (staticResolver) Scheme() string { return "fencer" }

func (staticResolver) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(strings.TrimPrefix(target.URL.Path, "/"), ",") {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		addrs = append(addrs, resolver.Address{Addr: a, ServerName: host})
	}
	return staticResolver{}, cc.UpdateState(resolver.State{Addresses: addrs})
}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (staticResolver) Close() {}
