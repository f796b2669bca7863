package integration_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// The fenced register is the model the chaos histories are checked
// against: one value, written with a fencing token. A write that the store
// accepted must carry a token no lower than that of every write linearized
// before it, and a read returns the last accepted value. A stale write that
// lands after a newer holder's write is therefore not linearizable, which
// is exactly the failure fencing exists to prevent.
type regState struct {
	val int   // 0: never written
	tok int64 // token of the write that set val
}

type regInput struct {
	write bool
	tok   int64
	val   int
}

type regOutput struct {
	ok      bool // write accepted (always true for a read)
	unknown bool // the write's outcome is unknown (timeout, partition)
	val     int  // the value a read returned
}

var fencedRegister = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		switch {
		case !in.write:
			return out.val == s.val, s
		case out.unknown:
			// Applied if it could have been; never illegal by itself.
			if in.tok >= s.tok {
				return true, regState{val: in.val, tok: in.tok}
			}
			return true, s
		case out.ok:
			return in.tok >= s.tok, regState{val: in.val, tok: in.tok}
		default:
			return true, s // a rejected write changes nothing
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		if !in.write {
			return fmt.Sprintf("read() -> %d", out.val)
		}
		return fmt.Sprintf("write(tok=%d, %d) -> ok=%v unknown=%v", in.tok, in.val, out.ok, out.unknown)
	},
}

// history records operations on a register, timed on one monotonic clock,
// for a porcupine model: the fenced register (regInput, regOutput) or the
// leased register (leaseInput, leaseOutput).
type history struct {
	start time.Time

	mu      sync.Mutex
	ops     []porcupine.Operation
	unknown []int // indexes of ops whose return is open-ended
}

func newHistory() *history { return &history{start: time.Now()} }

// now is the time since the history started, in nanoseconds.
func (h *history) now() int64 { return time.Since(h.start).Nanoseconds() }

// add records a fenced-register operation called at call and returning now.
func (h *history) add(client int, in regInput, call int64, out regOutput) {
	h.record(client, in, call, out, out.unknown)
}

// record records an operation called at call and returning now; an
// operation of unknown outcome may take effect at any time after its call.
func (h *history) record(client int, in any, call int64, out any, unknown bool) {
	ret := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if unknown {
		h.unknown = append(h.unknown, len(h.ops))
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// len returns the number of operations recorded, and how many of them are
// of unknown outcome.
func (h *history) len() (ops, unknown int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops), len(h.unknown)
}

// check returns porcupine's verdict on the history as a fenced register.
func (h *history) check(t *testing.T) porcupine.CheckResult {
	t.Helper()
	res := h.checkAgainst(fencedRegister, time.Minute)
	ops, unknown := h.len()
	t.Logf("history: %d operations, %d of unknown outcome: %s", ops, unknown, res)
	return res
}

// checkAgainst returns porcupine's verdict on the history as model.
// Operations of unknown outcome return after every other.
func (h *history) checkAgainst(model porcupine.Model, timeout time.Duration) porcupine.CheckResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.openUnknown()
	return porcupine.CheckOperationsTimeout(model, h.ops, timeout)
}

// visualize writes porcupine's visualization of the history as model to
// the HTML file path.
func (h *history) visualize(model porcupine.Model, path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.openUnknown()
	_, info := porcupine.CheckOperationsVerbose(model, h.ops, time.Minute)
	return porcupine.VisualizePath(model, info, path)
}

func (h *history) openUnknown() {
	end := h.now() + 1
	for _, i := range h.unknown {
		h.ops[i].Return = end
	}
}

// TestFencedRegisterModel shows that the model accepts fenced histories and
// rejects the one fencing prevents: an older token's write landing after a
// newer token's write was read.
func TestFencedRegisterModel(t *testing.T) {
	w := func(client int, tok int64, val int, call, ret int64, ok bool) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: regInput{write: true, tok: tok, val: val}, Call: call, Output: regOutput{ok: ok}, Return: ret}
	}
	r := func(val int, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Input: regInput{}, Call: call, Output: regOutput{ok: true, val: val}, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"fenced handover", []porcupine.Operation{w(1, 5, 1, 0, 1, true), w(2, 9, 2, 2, 3, true), r(2, 4, 5), w(1, 5, 3, 6, 7, false), r(2, 8, 9)}, true},
		{"stale write lands after a newer one", []porcupine.Operation{w(1, 5, 1, 0, 1, true), w(2, 9, 2, 2, 3, true), r(2, 4, 5), w(1, 5, 3, 6, 7, true), r(3, 8, 9)}, false},
		{"late write overlapping the handover may go first", []porcupine.Operation{w(1, 5, 1, 0, 10, true), w(2, 9, 2, 2, 3, true), r(2, 11, 12)}, true},
		{"lost write", []porcupine.Operation{w(1, 5, 1, 0, 1, true), r(0, 2, 3)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, porcupine.CheckOperations(fencedRegister, tc.ops))
		})
	}
}
