package main

import (
	"strings"

	"google.golang.org/grpc/resolver"
)

// staticResolver resolves "fencer:///host:port,host:port" to those
// addresses, so that --server can name several servers.
type staticResolver struct{}

func (staticResolver) Scheme() string { return "fencer" }

func (staticResolver) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(strings.TrimPrefix(target.URL.Path, "/"), ",") {
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	return staticResolver{}, cc.UpdateState(resolver.State{Addresses: addrs})
}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (staticResolver) Close() {}
