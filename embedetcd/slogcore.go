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
// Unlike a member's, no entry is logged at a level other than its own.
// It adds no attributes of its own: give log a component.
func ZapLogger(log *slog.Logger) *zap.Logger { return newZapLogger(log, nil) }

// newZapLogger is ZapLogger for a member's logs when member is not nil:
// at the levels member.level gives them.
func newZapLogger(log *slog.Logger, member *memberLog) *zap.Logger {
	return zap.New(&slogCore{log: log, min: zapcore.WarnLevel, member: member})
}

// moot are warnings every embedded member logs at start, about choices
// that matter where others can reach etcd: the member serves its gRPC
// and HTTP clients on one listener, and would sign auth tokens with the
// "simple" provider. fencer's member serves only the owner's 0600 unix
// socket, with auth off, and its only client is fencer's gRPC one. They
// go out at info.
var moot = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	"simple token is not cryptographically signed":                                         true,
}

// startupRace are the warning and the error a new member may log once,
// a moment after its cluster version is first set: etcd's storage-version
// monitor wakes on that, and reads the backend before its first commit
// has saved the raft term, so it finds no version ("missing term
// information"; etcd-io/etcd#18978). It tries again every 4 s, by when
// the commit has long happened. The first of each goes out at info; a
// second is a real failure and keeps etcd's level.
var startupRace = [...]string{"Failed to detect schema version", "failed to update storage version"}

// memberLog is what the logger of one member knows beyond each entry.
type memberLog struct {
	// closing is set once the member is being closed: etcd reports its
	// listeners closing as errors.
	closing atomic.Bool
	// raced records which of startupRace has been logged once.
	raced [len(startupRace)]atomic.Bool
}

// level is the slog level of a member's entry: debug once closing, info
// for what moot and startupRace name (see there), and otherwise zap's
// level mapped by slogLevel.
func (m *memberLog) level(e zapcore.Entry) slog.Level {
	if m.closing.Load() {
		return slog.LevelDebug
	}
	if moot[e.Message] {
		return slog.LevelInfo
	}
	for i, msg := range startupRace {
		if e.Message == msg && m.raced[i].CompareAndSwap(false, true) {
			return slog.LevelInfo
		}
	}
	return slogLevel(e.Level)
}

// slogCore is a zapcore.Core that writes to a slog.Logger, so that etcd's
// zap logs reach fencer's logger. (go.uber.org/zap/exp/zapslog bridges the
// other way, slog to zap.) Fields become attributes in key order; entries
// below min are dropped before their fields are encoded. A member's
// entries (member not nil) go out at member.level.
type slogCore struct {
	log    *slog.Logger
	min    zapcore.Level
	attrs  []slog.Attr
	member *memberLog
}

var _ zapcore.Core = (*slogCore)(nil)

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, attrs: append(slices.Clip(c.attrs), attrsOf(fields)...), member: c.member}
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
	if c.member != nil {
		level = c.member.level(e)
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
