package embedetcd

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ZapLogger returns a zap logger that writes etcd's entries at warn and
// above to log, as the embedded member's are (at slog's warn or error
// level, fields as attributes, the zap logger's name as logger), for an
// etcd client's clientv3.Config.Logger. Entries below warn are dropped.
// It adds no attributes of its own: give log a component.
func ZapLogger(log *slog.Logger) *zap.Logger { return newZapLogger(log, new(atomic.Bool)) }

// newZapLogger is ZapLogger, with records at debug once closing is set.
func newZapLogger(log *slog.Logger, closing *atomic.Bool) *zap.Logger {
	return zap.New(&slogCore{log: log, min: zapcore.WarnLevel, closing: closing})
}

// slogCore is a zapcore.Core that writes to a slog.Logger, so that etcd's
// zap logs reach fencer's logger. (go.uber.org/zap/exp/zapslog bridges the
// other way, slog to zap.) Fields become attributes in key order; entries
// below min are dropped before their fields are encoded. Once closing is
// set, records go out at debug level: etcd reports its listeners closing
// under it as errors.
type slogCore struct {
	log     *slog.Logger
	min     zapcore.Level
	attrs   []slog.Attr
	closing *atomic.Bool
}

var _ zapcore.Core = (*slogCore)(nil)

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, attrs: append(slices.Clip(c.attrs), attrsOf(fields)...), closing: c.closing}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	attrs := append(slices.Clip(c.attrs), attrsOf(fields)...)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	level := slogLevel(e.Level)
	if c.closing.Load() {
		level = slog.LevelDebug
	}
	c.log.LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func attrsOf(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	return attrs
}

// slogLevel maps zap's levels to slog's; DPanic, Panic and Fatal are
// errors (etcd panics or exits on its own after logging them).
func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l < zapcore.InfoLevel:
		return slog.LevelDebug
	case l < zapcore.WarnLevel:
		return slog.LevelInfo
	case l < zapcore.ErrorLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}
