package etcdstore

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// CheckedPut is one put of PutManyChecked: arguments that CheckPut has
// checked, and the put's options.
type CheckedPut struct {
	Checked Checked
	Options []WriteOption
}

// PutResult is the outcome of one put of PutManyChecked: PutChecked's
// revision and error.
type PutResult struct {
	Revision int64
	Err      error
}

// PutManyChecked runs PutChecked for each of puts, all at once with ctx,
// and returns each one's result, results[i] for puts[i]. Each put is
// exactly the guarded write PutChecked makes, with its own compares and
// ownership rule, and commits or fails on its own (a stale token fails its
// put alone). What differs from as many concurrent PutChecked calls is how
// they travel: on a store that batches, their Txns enter the queue
// together, so that when no Txn is in flight they leave as one shared Txn
// (up to the batch size) instead of the first alone and the others after
// it, without a goroutine each. A put whose guess of its key's owner
// record was wrong goes on by itself, as PutChecked would. Puts of the
// same key are not ordered.
func (s *Store) PutManyChecked(ctx context.Context, puts []CheckedPut) []PutResult {
	out := make([]PutResult, len(puts))
	writes := make([]*keyWrite, 0, len(puts))
	index := make([]int, 0, len(puts)) // writes[j] is puts[index[j]]
	txns := make([]txnArgs, 0, len(puts))
	for i, p := range puts {
		c := p.Checked
		if err := c.checkedFor(checkedPut); err != nil {
			out[i].Err = err
			continue
		}
		w := s.newKeyWrite(c.tok, c.name, clientv3.OpPut(s.DataKey(c.name), string(c.value)), token.ApplyWriteOptions(p.Options).TakeOver)
		cmps, then := w.txn()
		writes, index, txns = append(writes, w), append(index, i), append(txns, txnArgs{cmps: cmps, then: then})
	}
	resps, errs := s.commitAll(ctx, txns)
	var wg sync.WaitGroup
	for j, w := range writes {
		i := index[j]
		if errs[j] != nil {
			out[i].Err = fmt.Errorf("etcdstore: put %q: %w", w.key, errs[j])
			continue
		}
		if resps[j].Succeeded {
			_, rev, _, err := w.settle(ctx, resps[j]) // no I/O: the write committed
			out[i] = putResult(w.key, rev, err)
			continue
		}
		wg.Go(func() { // stale, or a wrong guess of the owner: reads and retries
			for resp := resps[j]; ; {
				_, rev, done, err := w.settle(ctx, resp)
				if done {
					out[i] = putResult(w.key, rev, err)
					return
				}
				cmps, then := w.txn()
				if resp, err = s.commit(ctx, cmps, then, nil); err != nil {
					out[i] = putResult(w.key, 0, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return out
}

// putResult is the PutResult of a put of key, its error wrapped as
// PutChecked wraps it.
func putResult(key string, rev int64, err error) PutResult {
	if err != nil {
		return PutResult{Err: fmt.Errorf("etcdstore: put %q: %w", key, err)}
	}
	return PutResult{Revision: rev}
}

// commitAll runs the Txns txns at once: together through the batcher
// when the store batches, else each alone and concurrently.
func (s *Store) commitAll(ctx context.Context, txns []txnArgs) ([]*clientv3.TxnResponse, []error) {
	if s.batch != nil {
		return s.batch.doAll(ctx, txns)
	}
	resps, errs := make([]*clientv3.TxnResponse, len(txns)), make([]error, len(txns))
	var wg sync.WaitGroup
	for i, t := range txns {
		wg.Go(func() { resps[i], errs[i] = txnAlone(ctx, s.cli, t.cmps, t.then, nil) })
	}
	wg.Wait()
	return resps, errs
}
