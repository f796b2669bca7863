package integration_test

import (
	"flag"
	"io"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
)

func TestMain(m *testing.M) {
	// The etcd chaos test runs etcd members as re-executions of this
	// binary.
	etcdproc.RunIfMember()
	// ...and the holders of the etcd chaos test.
	runChaosHolderIfAsked()
	// client-go's leader election logs every transition through klog; the
	// tests report what matters themselves.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	ctrllog.SetLogger(logr.Discard())
	fencertest.Main(m, fencertest.IgnoreInProcessPeers())
}
