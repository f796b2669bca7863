package embedetcd

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestSlogCore(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})
	member := new(memberLog)
	log := zap.New(&slogCore{log: slog.New(h), min: zapcore.WarnLevel, member: member}).Named("raft").With(zap.String("member", "m1"))
	for _, tc := range []struct {
		write func()
		want  string
	}{
		{func() { log.Info("dropped", zap.Int("n", 1)) }, ""},
		{func() { log.Debug("dropped") }, ""},
		{func() { log.Warn("slow fdatasync", zap.Duration("took", 1500e6), zap.Int("n", 2)) },
			"level=WARN msg=\"slow fdatasync\" member=m1 n=2 took=1.5s logger=raft\n"},
		{func() { log.Error("lost leader", zap.Error(errors.New("boom"))) },
			"level=ERROR msg=\"lost leader\" member=m1 error=boom logger=raft\n"},
		{func() { log.DPanic("odd") }, "level=ERROR msg=odd member=m1 logger=raft\n"},
		{func() { member.closing.Store(true); log.Error("listener closed") }, "level=DEBUG msg=\"listener closed\" member=m1 logger=raft\n"},
	} {
		buf.Reset()
		tc.write()
		require.Equal(t, tc.want, buf.String())
	}
}

// TestMemberLogQuietsWhatAFreshMemberLogsFalsely: the member's logger
// passes etcd's advice for production deployments, which the embedded
// member's private socket makes moot, at info, and the storage-version
// race of a new member (etcd-io/etcd#18978) at info the first time only:
// etcd tries again 4 s later, so a second failure is a real one and keeps
// its level. An etcd client's logger demotes nothing.
func TestMemberLogQuietsWhatAFreshMemberLogsFalsely(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})
	member := newZapLogger(slog.New(h), new(memberLog))
	client := ZapLogger(slog.New(h))
	detect := func(log *zap.Logger) func() {
		return func() { log.Warn("Failed to detect schema version", zap.Error(errors.New("missing term information"))) }
	}
	update := func(log *zap.Logger) func() {
		return func() { log.Error("failed to update storage version", zap.String("cluster-version", "3.7.0")) }
	}
	for _, tc := range []struct {
		write func()
		want  string
	}{
		{func() {
			member.Warn("Running http and grpc server on single port. This is not recommended for production.")
		},
			"level=INFO msg=\"Running http and grpc server on single port. This is not recommended for production.\"\n"},
		{func() { member.Warn("simple token is not cryptographically signed") },
			"level=INFO msg=\"simple token is not cryptographically signed\"\n"},
		{detect(member), "level=INFO msg=\"Failed to detect schema version\" error=\"missing term information\"\n"},
		{update(member), "level=INFO msg=\"failed to update storage version\" cluster-version=3.7.0\n"},
		{detect(member), "level=WARN msg=\"Failed to detect schema version\" error=\"missing term information\"\n"},
		{update(member), "level=ERROR msg=\"failed to update storage version\" cluster-version=3.7.0\n"},
		{func() { client.Warn("simple token is not cryptographically signed") },
			"level=WARN msg=\"simple token is not cryptographically signed\"\n"},
		{update(client), "level=ERROR msg=\"failed to update storage version\" cluster-version=3.7.0\n"},
	} {
		buf.Reset()
		tc.write()
		require.Equal(t, tc.want, buf.String())
	}
}
