package embedetcd

import (
	"bytes"
	"errors"
	"log/slog"
	"sync/atomic"
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
	closing := new(atomic.Bool)
	log := zap.New(&slogCore{log: slog.New(h), min: zapcore.WarnLevel, closing: closing}).Named("raft").With(zap.String("member", "m1"))
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
		{func() { closing.Store(true); log.Error("listener closed") }, "level=DEBUG msg=\"listener closed\" member=m1 logger=raft\n"},
	} {
		buf.Reset()
		tc.write()
		require.Equal(t, tc.want, buf.String())
	}
}
