package history_test

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/internal/testkit/history"
)

// TestFencedRegisterModel shows that the model accepts fenced histories and
// rejects the one fencing prevents: an older token's write landing after a
// newer token's write was read.
func TestFencedRegisterModel(t *testing.T) {
	w := func(client int, tok int64, val int, call, ret int64, ok bool) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: history.Input{Write: true, Tok: tok, Val: val}, Call: call, Output: history.Output{OK: ok}, Return: ret}
	}
	r := func(val int, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Input: history.Input{}, Call: call, Output: history.Output{OK: true, Val: val}, Return: ret}
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
			require.Equal(t, tc.want, porcupine.CheckOperations(history.FencedRegister, tc.ops))
		})
	}
}

// TestUnknownOutcomeMayLandLate: a write of unknown outcome may take
// effect after every operation recorded after it, so a read of its value
// later is linearizable; the same write recorded as refused is not.
func TestUnknownOutcomeMayLandLate(t *testing.T) {
	for _, unknown := range []bool{true, false} {
		h := history.New(time.Now())
		call := h.Now()
		h.Add(1, history.Input{Write: true, Tok: 1, Val: 7}, call, history.Output{Unknown: unknown})
		call = h.Now()
		h.Add(2, history.Input{}, call, history.Output{OK: true})
		call = h.Now()
		h.Add(2, history.Input{}, call, history.Output{OK: true, Val: 7})
		ops, open := h.Len()
		require.Equal(t, 3, ops)
		want := porcupine.Illegal
		if unknown {
			want = porcupine.Ok
			require.Equal(t, 1, open)
		}
		require.Equal(t, want, h.Check(history.FencedRegister, time.Minute), "unknown outcome %v", unknown)
	}
}

// TestRecordAtOrdersOperationsOfOtherProcessesByTheWallClock: operations
// timed in another process (wall-clock times without a monotonic reading)
// are placed by their times, so a stale write whose call follows a newer
// write's return is not linearizable, and the same write overlapping it
// is; an unknown outcome still returns after every other operation, also
// one recorded later in the history than its own return.
func TestRecordAtOrdersOperationsOfOtherProcessesByTheWallClock(t *testing.T) {
	start := time.Now()
	h := history.New(start)
	wall := func(ms int) int64 {
		return h.At(time.Unix(0, start.UnixNano()+int64(ms)*int64(time.Millisecond)))
	}
	require.Equal(t, int64(5*time.Millisecond), wall(5))
	for _, tc := range []struct {
		name      string
		staleCall int
		want      porcupine.CheckResult
	}{
		{"the stale write called after the newer one returned", 30, porcupine.Illegal},
		{"the stale write overlapping the newer one", 15, porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := history.New(start)
			h.RecordAt(2, history.Input{Write: true, Tok: 9, Val: 2}, wall(10), wall(20), history.Output{OK: true}, false)
			h.RecordAt(1, history.Input{Write: true, Tok: 5, Val: 1}, wall(tc.staleCall), wall(40), history.Output{OK: true}, false)
			h.RecordAt(3, history.Input{}, wall(50), wall(60), history.Output{OK: true, Val: 2}, false)
			require.Equal(t, tc.want, h.Check(history.FencedRegister, time.Minute))
		})
	}
	// The history's clock (Now) is still near its start; the read is
	// timed seconds later.
	h.RecordAt(1, history.Input{Write: true, Tok: 1, Val: 7}, wall(0), wall(1), history.Output{Unknown: true}, true)
	h.RecordAt(2, history.Input{}, wall(2), wall(3), history.Output{OK: true}, false)
	h.RecordAt(2, history.Input{}, wall(3000), wall(4000), history.Output{OK: true, Val: 7}, false)
	require.Equal(t, porcupine.Ok, h.Check(history.FencedRegister, time.Minute), "the unknown write may land after the first read")
}
