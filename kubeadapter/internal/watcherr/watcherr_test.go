package watcherr_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fencer-dev/fencer/kubeadapter/internal/watcherr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReportPassesEventsAndReportsErrors checks that every event comes
// through in order and that an Error event is reported, as an API error,
// before it is passed on.
func TestReportPassesEventsAndReportsErrors(t *testing.T) {
	in := watch.NewFake()
	var reported []error
	w := watcherr.Report(in, func(err error) { reported = append(reported, err) })
	defer w.Stop()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	gone := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old"}
	go func() {
		in.Add(lease)
		in.Error(gone)
		in.Modify(lease)
	}()
	for _, want := range []watch.EventType{watch.Added, watch.Error, watch.Modified} {
		select {
		case ev := <-w.ResultChan():
			require.Equal(t, want, ev.Type)
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s event", want)
		}
	}
	require.Len(t, reported, 1)
	require.True(t, apierrors.IsResourceExpired(reported[0]), "reported %v", reported[0])
}

// TestStopEndsAWatchNobodyReads checks that Stop ends the forwarding
// goroutine even while an event waits for a reader that has gone, as the
// reflector leaves it: with apimachinery's watch.Filter in Report's place
// the goroutine blocks forever and this test fails.
func TestStopEndsAWatchNobodyReads(t *testing.T) {
	in := watch.NewFakeWithChanSize(1, false)
	w := watcherr.Report(in, func(error) {})
	in.Add(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	w.Stop()
	goleak.VerifyNone(t)
}
