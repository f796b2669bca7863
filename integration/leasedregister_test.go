package integration_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// The leased register is the model the etcd chaos histories are checked
// against. It states the etcd store's guarantee: a guarded write commits
// only if its token is the lease's current token at the write's
// linearization point. That is stronger than the fenced register of the
// Kubernetes tests (accepted tokens never decrease): a write with a token
// that was current once, but is not any more, must not commit even if no
// newer holder has written yet.
//
// One lease guards one value. The operations are:
//
//   - acquire() -> token: the token becomes current; it is greater, in
//     revision and in epoch, than every token acquired before;
//   - write(token, v) -> ok | stale: ok only if token is current, and
//     then the value is v; a stale refusal changes nothing;
//   - read() -> v: the last value written (0: none);
//   - release(token): if token is current, the lease becomes free.
//
// A lease also ends when its holder's session expires, which no operation
// records. So the model never requires a write to succeed: refusing a write
// whose token is current is allowed (its session may just have expired).
// A store that accepts a write whose token is not current is never allowed.
//
// An operation whose outcome is unknown (a timeout, a killed member) may
// take effect at any point after its call, or never; its return is moved
// to the end of the history, and it takes effect where it is linearized if
// it can: an acquire makes an unknown token current, a write with the
// current token sets the value, a release frees the lease.
type leaseKind int

const (
	opRead leaseKind = iota
	opWrite
	opAcquire
	opRelease
)

type leaseTok struct {
	rev   int64  // the token's revision; -1 for an acquisition whose token is unknown
	epoch uint64 // the token's epoch
}

type leaseInput struct {
	kind leaseKind
	tok  leaseTok // of a write or release
	val  int      // of a write
}

type leaseOutput struct {
	ok      bool     // the write was accepted; the acquire succeeded
	unknown bool     // the outcome is unknown
	tok     leaseTok // the token an acquire returned
	val     int      // the value a read returned
}

type leaseState struct {
	cur leaseTok // the current token; zero: the lease is free
	max leaseTok // the greatest token acquired so far
	val int
}

var leasedRegister = porcupine.Model{
	Init: func() any { return leaseState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(leaseState), input.(leaseInput), output.(leaseOutput)
		switch in.kind {
		case opRead:
			return out.val == s.val, s
		case opAcquire:
			if out.unknown {
				s.cur = leaseTok{rev: -1}
				return true, s
			}
			if out.tok.rev <= s.max.rev || out.tok.epoch <= s.max.epoch {
				return false, s // token order: greater than every earlier one
			}
			s.cur, s.max = out.tok, out.tok
			return true, s
		case opWrite:
			current := in.tok == s.cur
			switch {
			case out.ok:
				if !current {
					return false, s
				}
				s.val = in.val
			case out.unknown && current:
				s.val = in.val
			}
			return true, s // a refusal changes nothing
		case opRelease:
			if in.tok == s.cur {
				s.cur = leaseTok{}
			}
			return true, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(leaseInput), output.(leaseOutput)
		res := "ok"
		switch {
		case out.unknown:
			res = "unknown"
		case !out.ok:
			res = "stale"
		}
		switch in.kind {
		case opRead:
			return fmt.Sprintf("read() -> %d", out.val)
		case opAcquire:
			if out.unknown {
				return "acquire() -> unknown"
			}
			return fmt.Sprintf("acquire() -> %d/e%d", out.tok.rev, out.tok.epoch)
		case opWrite:
			return fmt.Sprintf("write(%d/e%d, %d) -> %s", in.tok.rev, in.tok.epoch, in.val, res)
		default:
			return fmt.Sprintf("release(%d/e%d) -> %s", in.tok.rev, in.tok.epoch, res)
		}
	},
	DescribeState: func(state any) string {
		s := state.(leaseState)
		return fmt.Sprintf("current %d/e%d, value %d", s.cur.rev, s.cur.epoch, s.val)
	},
}

// TestLeasedRegisterModel shows that the model accepts what a fenced store
// does and rejects each way a store can fail to fence, including the one
// the Kubernetes model allows: a superseded token writing before the newer
// holder has written anything.
func TestLeasedRegisterModel(t *testing.T) {
	at := int64(0)
	op := func(client int, in leaseInput, out leaseOutput) porcupine.Operation {
		at += 2
		return porcupine.Operation{ClientId: client, Input: in, Call: at - 2, Output: out, Return: at - 1}
	}
	acq := func(c int, rev int64, ep uint64) porcupine.Operation {
		return op(c, leaseInput{kind: opAcquire}, leaseOutput{ok: true, tok: leaseTok{rev, ep}})
	}
	wr := func(c int, rev int64, ep uint64, v int, ok bool) porcupine.Operation {
		return op(c, leaseInput{kind: opWrite, tok: leaseTok{rev, ep}, val: v}, leaseOutput{ok: ok})
	}
	rd := func(v int) porcupine.Operation { return op(0, leaseInput{}, leaseOutput{ok: true, val: v}) }
	rel := func(c int, rev int64, ep uint64) porcupine.Operation {
		return op(c, leaseInput{kind: opRelease, tok: leaseTok{rev, ep}}, leaseOutput{ok: true})
	}
	for _, tc := range []struct {
		name string
		ops  func() []porcupine.Operation
		want bool
	}{
		{"fenced handover", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), wr(1, 5, 1, 1, true), acq(2, 9, 2), wr(2, 9, 2, 2, true), wr(1, 5, 1, 3, false), rd(2)}
		}, true},
		{"a refused write with the current token (its session expired)", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), wr(1, 5, 1, 1, false), rd(0)}
		}, true},
		{"superseded token accepted before the new holder writes", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), acq(2, 9, 2), wr(1, 5, 1, 3, true)}
		}, false},
		{"superseded token accepted after the new holder wrote", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), acq(2, 9, 2), wr(2, 9, 2, 2, true), wr(1, 5, 1, 3, true), rd(3)}
		}, false},
		{"write accepted after release", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), rel(1, 5, 1), wr(1, 5, 1, 3, true)}
		}, false},
		{"write with a token never issued", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), wr(1, 5, 7, 3, true)}
		}, false},
		{"token order broken", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 9, 2), acq(2, 5, 3)}
		}, false},
		{"epoch order broken", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 2), acq(2, 9, 2)}
		}, false},
		{"lost write", func() []porcupine.Operation {
			return []porcupine.Operation{acq(1, 5, 1), wr(1, 5, 1, 1, true), rd(0)}
		}, false},
		{"a late write overlapping the handover may go first", func() []porcupine.Operation {
			a := acq(1, 5, 1)
			w := op(1, leaseInput{kind: opWrite, tok: leaseTok{5, 1}, val: 1}, leaseOutput{ok: true})
			b, wb := acq(2, 9, 2), wr(2, 9, 2, 2, true)
			w.Return = wb.Return + 1 // called before the handover, returned after
			at = w.Return + 1
			return []porcupine.Operation{a, w, b, wb, rd(2)}
		}, true},
		{"...but not after a read saw the newer write", func() []porcupine.Operation {
			a := acq(1, 5, 1)
			w := op(1, leaseInput{kind: opWrite, tok: leaseTok{5, 1}, val: 1}, leaseOutput{ok: true})
			b, wb, r := acq(2, 9, 2), wr(2, 9, 2, 2, true), rd(2)
			w.Return = r.Return + 1
			at = w.Return + 1
			return []porcupine.Operation{a, w, b, wb, r, rd(1)}
		}, false},
		{"an unknown write may land late, or never", func() []porcupine.Operation {
			a := acq(1, 5, 1)
			w := op(1, leaseInput{kind: opWrite, tok: leaseTok{5, 1}, val: 1}, leaseOutput{unknown: true})
			r0, r1 := rd(0), rd(1)
			w.Return = at + 10
			return []porcupine.Operation{a, w, r0, r1}
		}, true},
		{"an unknown acquire may take effect late", func() []porcupine.Operation {
			a, u := acq(1, 5, 1), op(2, leaseInput{kind: opAcquire}, leaseOutput{unknown: true})
			u.Return = at + 10
			return []porcupine.Operation{a, u, wr(1, 5, 1, 1, true), rd(1)}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at = 0
			require.Equal(t, tc.want, porcupine.CheckOperations(leasedRegister, tc.ops()))
		})
	}
}

// withoutNoOps returns the closed history ops (every unknown return moved
// to the end) without the operations of unknown outcome that cannot change
// the verdict, so that porcupine decides a round with many timeouts in
// seconds rather than searching every subset of them. Each unknown
// operation has its return at the end and a step that is always legal, so
// placing it last is always possible; it may be dropped if, in any legal
// order, it can be moved last without making another operation illegal:
//
//   - an unknown acquire or release: either only ends the current token
//     (sets an unknown one, or none). Until the next known acquire no write
//     can then be accepted, so the operations in between are reads,
//     refusals, releases that do nothing, and unknown operations (also
//     moved last). Moving them all last leaves every read's value and the
//     state at the next acquire as they were;
//   - an unknown write whose token no known acquire returned, or whose
//     token a known acquire had superseded before the write's call: its
//     token can never be current where it could be placed, so it changes
//     nothing.
//
// TestWithoutNoOpsKeepsTheVerdict checks this against porcupine on random
// histories.
func withoutNoOps(ops []porcupine.Operation) []porcupine.Operation {
	type acq struct {
		tok leaseTok
		ret int64
	}
	var acqs []acq
	for _, op := range ops {
		if in, out := op.Input.(leaseInput), op.Output.(leaseOutput); in.kind == opAcquire && out.ok && !out.unknown {
			acqs = append(acqs, acq{out.tok, op.Return})
		}
	}
	canBeCurrent := func(op porcupine.Operation) bool {
		tok, issued := op.Input.(leaseInput).tok, false
		for _, a := range acqs {
			switch {
			case a.tok == tok:
				issued = true
			case a.tok.rev > tok.rev && a.ret < op.Call:
				return false
			}
		}
		return issued
	}
	kept := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		if op.Output.(leaseOutput).unknown {
			if k := op.Input.(leaseInput).kind; k != opWrite || !canBeCurrent(op) {
				continue
			}
		}
		kept = append(kept, op)
	}
	return kept
}

// TestWithoutNoOpsKeepsTheVerdict: on random histories of concurrent
// holders with many operations of unknown outcome, porcupine's verdict on
// the history and on withoutNoOps of it are the same, and both kinds of
// verdict occur.
func TestWithoutNoOpsKeepsTheVerdict(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	verdicts := map[bool]int{}
	for i := range 3000 {
		ops := randomLeaseHistory(rng)
		want := porcupine.CheckOperations(leasedRegister, ops)
		pruned := withoutNoOps(ops)
		require.Equal(t, want, porcupine.CheckOperations(leasedRegister, pruned), "history %d:\n%s", i, describeLeaseOps(ops))
		verdicts[want]++
	}
	require.Positive(t, verdicts[true], "no legal history generated")
	require.Positive(t, verdicts[false], "no illegal history generated")
	t.Logf("verdicts: %d legal, %d illegal", verdicts[true], verdicts[false])
}

// randomLeaseHistory returns a short closed history: three clients that
// acquire, write, release and read one lease, with overlapping calls,
// random outcomes (including unknown ones, returned at the end) and tokens
// that are sometimes superseded or never issued.
func randomLeaseHistory(rng *rand.Rand) []porcupine.Operation {
	var ops []porcupine.Operation
	var toks []leaseTok
	rev, epoch, val := int64(0), uint64(0), 0
	at := int64(0)
	end := int64(1 << 40)
	for range 4 + rng.IntN(7) {
		call := at
		at += 1 + int64(rng.IntN(3))
		ret := call + 1 + int64(rng.IntN(6))
		client := rng.IntN(3)
		var in leaseInput
		var out leaseOutput
		pickTok := func() leaseTok {
			if len(toks) == 0 || rng.IntN(8) == 0 {
				return leaseTok{rev: int64(rng.IntN(20)), epoch: uint64(rng.IntN(5))}
			}
			return toks[rng.IntN(len(toks))]
		}
		switch rng.IntN(4) {
		case 0:
			in.kind = opAcquire
			rev += 1 + int64(rng.IntN(3))
			epoch++
			out = leaseOutput{ok: true, tok: leaseTok{rev: rev, epoch: epoch}}
			toks = append(toks, out.tok)
		case 1:
			val++
			in = leaseInput{kind: opWrite, tok: pickTok(), val: val}
			out.ok = rng.IntN(2) == 0
		case 2:
			in = leaseInput{kind: opRelease, tok: pickTok()}
			out.ok = true
		default:
			in.kind = opRead
			out = leaseOutput{ok: true, val: rng.IntN(val + 1)}
		}
		if in.kind != opRead && rng.IntN(3) == 0 {
			out = leaseOutput{unknown: true}
			ret = end
		}
		ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	}
	return ops
}

func describeLeaseOps(ops []porcupine.Operation) string {
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, "  [%d,%d] client %d: %s\n", op.Call, op.Return, op.ClientId, leasedRegister.DescribeOperation(op.Input, op.Output))
	}
	return b.String()
}
