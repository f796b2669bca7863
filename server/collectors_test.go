package server_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/server"
)

// TestConfigCollectors: Config.Collectors are served beside the server's
// own metrics, and one that clashes with them is refused by New.
func TestConfigCollectors(t *testing.T) {
	st := fencertest.SharedStore(t)
	extra := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fencer_test_extra", Help: "A collector given in Config."}, func() float64 { return 7 })
	srv, err := server.New(server.Config{Store: st, Authenticator: server.Anonymous("anonymous"), Collectors: []prometheus.Collector{extra}})
	require.NoError(t, err)
	require.Equal(t, 7.0, scrape(t, srv, "fencer_test_extra"))

	clash := prometheus.NewGauge(prometheus.GaugeOpts{Name: "fencer_etcd_up", Help: "The server's own name."})
	_, err = server.New(server.Config{Store: st, Authenticator: server.Anonymous("anonymous"), Collectors: []prometheus.Collector{clash}})
	require.Error(t, err)
}
