// Package history records concurrent operations on registers, timed on
// one monotonic clock, and checks them with porcupine. It holds the fenced
// register, the model that fencer's chaos and shard tests check their
// Kubernetes histories against; a test may check a history against a
// model of its own (Check).
package history

import (
	"fmt"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Input is an operation on a fenced register: a read, or a write of Val
// with token Tok.
type Input struct {
	Write bool
	Tok   int64
	Val   int
}

// Output is the outcome of an operation on a fenced register.
type Output struct {
	OK      bool // the write was accepted (always true for a read)
	Unknown bool // the write's outcome is unknown (a timeout, a partition)
	Val     int  // the value a read returned
}

type regState struct {
	val int   // 0: never written
	tok int64 // token of the write that set val
}

// FencedRegister is the model of one value written with a fencing token
// (Input, Output). A write that the store accepted must carry a token no
// lower than that of every write linearized before it, and a read returns
// the last accepted value. A stale write that lands after a newer holder's
// write is therefore not linearizable, which is exactly the failure
// fencing exists to prevent. A write of unknown outcome may take effect,
// if its token allows, or not.
//
// It does not require a write whose token was current once, but is not any
// more, to be refused before a newer holder has written: a store that
// only keeps tokens from decreasing satisfies it.
var FencedRegister = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(Input), output.(Output)
		switch {
		case !in.Write:
			return out.Val == s.val, s
		case out.Unknown:
			// Applied if it could have been; never illegal by itself.
			if in.Tok >= s.tok {
				return true, regState{val: in.Val, tok: in.Tok}
			}
			return true, s
		case out.OK:
			return in.Tok >= s.tok, regState{val: in.Val, tok: in.Tok}
		default:
			return true, s // a rejected write changes nothing
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		if !in.Write {
			return fmt.Sprintf("read() -> %d", out.Val)
		}
		return fmt.Sprintf("write(tok=%d, %d) -> ok=%v unknown=%v", in.Tok, in.Val, out.OK, out.Unknown)
	},
}

// History is the operations on one register. It is safe for concurrent
// use.
type History struct {
	start time.Time

	mu      sync.Mutex
	ops     []porcupine.Operation
	unknown []int // indexes of ops whose return is open-ended
}

// New returns an empty history whose clock starts at start. Histories with
// the same start share one clock.
func New(start time.Time) *History { return &History{start: start} }

// Now is the time on the history's clock, in nanoseconds: the call time
// to pass to Add or Record.
func (h *History) Now() int64 { return time.Since(h.start).Nanoseconds() }

// Add records a fenced-register operation called at call and returning
// now.
func (h *History) Add(client int, in Input, call int64, out Output) {
	h.Record(client, in, call, out, out.Unknown)
}

// Record records an operation of any model called at call and returning
// now. An operation of unknown outcome may take effect at any time after
// its call: Check moves its return after every other.
func (h *History) Record(client int, in any, call int64, out any, unknown bool) {
	h.RecordAt(client, in, call, h.Now(), out, unknown)
}

// At is time t on the wall clock, in nanoseconds since the history's
// start: the clock for a history whose operations are timed in several
// processes, which share the wall clock of their machine. Its operations
// must all be timed with At, not Now (the monotonic clock); a step of the
// wall clock while the history is recorded misplaces them.
func (h *History) At(t time.Time) int64 { return t.Round(0).Sub(h.start.Round(0)).Nanoseconds() }

// RecordAt is Record for an operation that returned at ret on the
// history's clock (At), such as one timed by another process.
func (h *History) RecordAt(client int, in any, call, ret int64, out any, unknown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if unknown {
		h.unknown = append(h.unknown, len(h.ops))
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// Len returns the number of operations recorded, and how many of them are
// of unknown outcome.
func (h *History) Len() (ops, unknown int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops), len(h.unknown)
}

// Ops returns a copy of the operations recorded, as recorded.
func (h *History) Ops() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Check returns porcupine's verdict on the history as model, within
// timeout (Unknown past it).
func (h *History) Check(model porcupine.Model, timeout time.Duration) porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(model, h.Closed(), timeout)
}

// Closed returns a copy of the operations with every return of unknown
// outcome moved to after every other: the history Check checks, for a
// caller that simplifies it first.
func (h *History) Closed() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	end := h.Now()
	for _, op := range ops {
		end = max(end, op.Return)
	}
	end++
	for _, i := range h.unknown {
		ops[i].Return = end
	}
	return ops
}
