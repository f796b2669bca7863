package integration_test

import (
	"flag"
	"io"
	"os"
	"testing"

	"go.uber.org/goleak"
	"k8s.io/klog/v2"
)

func TestMain(m *testing.M) {
	// client-go's leader election logs every transition through klog; the
	// tests report what matters themselves.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	klog.SetOutput(io.Discard)
	goleak.VerifyTestMain(m,
		// grpc-go's callback serializer exits shortly after a client closes.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
	os.Exit(0)
}
