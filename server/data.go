package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Check implements FencerService.Check. Any principal may check any token.
func (s *Server) Check(ctx context.Context, req *fencerv1.CheckRequest) (*fencerv1.CheckResponse, error) {
	tok, err := validateCheck(req)
	if err != nil {
		return nil, err
	}
	if err := s.store.Check(ctx, tok); err != nil {
		return nil, s.rejected(ctx, "check", tok, storeInput(err))
	}
	return &fencerv1.CheckResponse{}, nil
}

// Advance implements FencerService.Advance: etcdstore's Advance, taking
// the resource over from another lease only when the request says so.
func (s *Server) Advance(ctx context.Context, req *fencerv1.AdvanceRequest) (*fencerv1.AdvanceResponse, error) {
	in, err := validateAdvance(req)
	if err != nil {
		return nil, err
	}
	tok := in.Token()
	if err := s.checkOwner(ctx, tok, principalOf(ctx)); err != nil {
		return nil, s.rejected(ctx, "advance", tok, err)
	}
	if err := s.store.AdvanceChecked(ctx, in, takeOver(req.GetTakeOver())...); err != nil {
		return nil, s.rejected(ctx, "advance", tok, err)
	}
	return &fencerv1.AdvanceResponse{}, nil
}

// Put implements FencerService.Put: etcdstore's guarded Put, for the
// principal the token was issued to, refused for a key of another lease
// unless the request takes it over.
func (s *Server) Put(ctx context.Context, req *fencerv1.PutRequest) (*fencerv1.PutResponse, error) {
	in, err := s.admitPut(ctx, req)
	if err != nil {
		return nil, err
	}
	rev, err := s.store.PutChecked(ctx, in, takeOver(req.GetTakeOver())...)
	if err != nil {
		return nil, s.rejected(ctx, "put", in.Token(), err)
	}
	return &fencerv1.PutResponse{Revision: rev}, nil
}

// admitPut checks req and that its token was issued to the caller's
// principal, and returns its checked arguments: what Put and each put of
// PutMany do before they write.
func (s *Server) admitPut(ctx context.Context, req *fencerv1.PutRequest) (etcdstore.Checked, error) {
	in, err := validatePut(req)
	if err != nil {
		return etcdstore.Checked{}, err
	}
	if err := s.checkOwner(ctx, in.Token(), principalOf(ctx)); err != nil {
		return etcdstore.Checked{}, s.rejected(ctx, "put", in.Token(), err)
	}
	return in, nil
}

// PutMany implements FencerService.PutMany: each put as Put runs it, all
// of them at once through etcdstore's PutManyChecked, so that they leave
// in shared etcd Txns, each under its own guard. What the unary
// interceptor does for a Put it does for each put: authorize it
// (authorize passes a PutManyRequest through), hide other principals'
// leases from its error, turn that error into a status, count and log it.
func (s *Server) PutMany(ctx context.Context, req *fencerv1.PutManyRequest) (*fencerv1.PutManyResponse, error) {
	if err := validatePutMany(req); err != nil {
		return nil, err
	}
	start := time.Now()
	principal := principalOf(ctx)
	puts := req.GetPuts()
	errs := make([]error, len(puts))
	toks := make([]token.Token, len(puts))
	writes := make([]etcdstore.CheckedPut, 0, len(puts))
	index := make([]int, 0, len(puts)) // writes[j] is puts[index[j]]
	for i, r := range puts {
		err := s.authz.authorize(principal, r)
		var in etcdstore.Checked
		if err == nil {
			in, err = s.admitPut(ctx, r)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		toks[i] = in.Token()
		writes, index = append(writes, etcdstore.CheckedPut{Checked: in, Options: takeOver(r.GetTakeOver())}), append(index, i)
	}
	out := &fencerv1.PutManyResponse{Results: make([]*fencerv1.PutResult, len(puts))}
	for j, res := range s.store.PutManyChecked(ctx, writes) {
		i := index[j]
		if res.Err != nil {
			errs[i] = s.rejected(ctx, "put", toks[i], res.Err)
			continue
		}
		out.Results[i] = &fencerv1.PutResult{Result: &fencerv1.PutResult_Revision{Revision: res.Revision}}
		s.m.manyPutsOK.Inc()
	}
	for i, err := range errs {
		if err != nil {
			out.Results[i] = s.putOfManyFailed(ctx, principal, puts[i], err, time.Since(start))
		}
	}
	return out, nil
}

// putOfManyFailed is the result of a put of PutMany that failed with err,
// made as the unary interceptor makes a Put's error: with other
// principals' leases hidden, as a status, counted and logged.
func (s *Server) putOfManyFailed(ctx context.Context, principal string, req *fencerv1.PutRequest, err error, d time.Duration) *fencerv1.PutResult {
	err = toStatus(s.hideOthers(ctx, principal, req, err))
	s.m.manyPuts.WithLabelValues(status.Code(err).String()).Inc()
	s.logCall(ctx, putOfManyMethod, principal, err, d)
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		b, _ = proto.Marshal(status.New(codes.Internal, "server: encode the error of a put").Proto())
	}
	return &fencerv1.PutResult{Result: &fencerv1.PutResult_Error{Error: b}}
}

// putOfManyMethod names a put of PutMany in the server's logs.
const putOfManyMethod = "/fencer.v1.FencerService/PutMany.Put"

// Get implements FencerService.Get. Reads are not guarded.
func (s *Server) Get(ctx context.Context, req *fencerv1.GetRequest) (*fencerv1.GetResponse, error) {
	v, ok, err := s.store.Get(ctx, req.GetKey()) // Get checks the key
	if err != nil {
		return nil, storeInput(err)
	}
	if !ok {
		return &fencerv1.GetResponse{}, nil
	}
	return &fencerv1.GetResponse{Found: true, Value: v.Data, CreateRevision: v.CreateRevision, ModRevision: v.ModRevision}, nil
}

// ListKeys implements FencerService.ListKeys: one page of etcdstore's
// GetPage, without the keys the caller's principal may not read. The page
// token encodes the page's last key.
func (s *Server) ListKeys(ctx context.Context, req *fencerv1.ListKeysRequest) (*fencerv1.ListKeysResponse, error) {
	size, after, err := validateListKeys(req)
	if err != nil {
		return nil, err
	}
	principal := principalOf(ctx)
	out := &fencerv1.ListKeysResponse{}
	for len(out.Keys) < size {
		page, more, err := s.store.GetPage(ctx, req.GetPrefix(), after, size-len(out.Keys))
		if err != nil {
			return nil, err
		}
		for _, kv := range page {
			after = kv.Key
			if s.authz != nil && !s.authz.Allowed(principal, "read", kv.Key) {
				continue
			}
			out.Keys = append(out.Keys, &fencerv1.KeyValue{Key: kv.Key, Value: kv.Data, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision})
		}
		if !more {
			return out, nil
		}
	}
	// As with ListLeases, the page token names the last key returned,
	// never one the caller may not read.
	out.NextPageToken = encodePageToken(out.Keys[len(out.Keys)-1].Key)
	return out, nil
}

// Delete implements FencerService.Delete: etcdstore's guarded Delete, with
// the same ownership rule as Put.
func (s *Server) Delete(ctx context.Context, req *fencerv1.DeleteRequest) (*fencerv1.DeleteResponse, error) {
	in, err := validateDelete(req)
	if err != nil {
		return nil, err
	}
	tok := in.Token()
	if err := s.checkOwner(ctx, tok, principalOf(ctx)); err != nil {
		return nil, s.rejected(ctx, "delete", tok, err)
	}
	deleted, err := s.store.DeleteChecked(ctx, in, takeOver(req.GetTakeOver())...)
	if err != nil {
		return nil, s.rejected(ctx, "delete", tok, err)
	}
	return &fencerv1.DeleteResponse{Deleted: deleted}, nil
}

// Txn implements FencerService.Txn: the request's compares and operations,
// on data keys, run as etcdstore's guarded Txn, which also checks that the
// token's lease owns (or may claim) every key either branch writes.
func (s *Server) Txn(ctx context.Context, req *fencerv1.TxnRequest) (*fencerv1.TxnResponse, error) {
	in, err := validateTxn(req)
	if err != nil {
		return nil, err
	}
	tok := in.Token()
	if err := s.checkOwner(ctx, tok, principalOf(ctx)); err != nil {
		return nil, s.rejected(ctx, "txn", tok, err)
	}
	cmps := make([]clientv3.Cmp, len(req.GetCompares()))
	for i, c := range req.GetCompares() {
		cmps[i] = s.compare(c)
	}
	resp, err := s.store.TxnChecked(ctx, in, cmps, s.ops(req.GetSuccess()), s.ops(req.GetFailure()), takeOver(req.GetTakeOver())...)
	if err != nil {
		return nil, s.rejected(ctx, "txn", tok, err)
	}
	out := &fencerv1.TxnResponse{Succeeded: resp.Succeeded, Results: make([]*fencerv1.OpResult, len(resp.Responses))}
	for i, r := range resp.Responses {
		out.Results[i] = opResult(r)
	}
	return out, nil
}

// takeOver returns the write options of a request's take_over field.
func takeOver(set bool) []etcdstore.WriteOption {
	if set {
		return []etcdstore.WriteOption{etcdstore.TakeOver()}
	}
	return nil
}

// compare turns a validated Compare into an etcd Cmp on a data key.
func (s *Server) compare(c *fencerv1.Compare) clientv3.Cmp {
	key := s.store.DataKey(c.GetKey())
	var cmp clientv3.Cmp
	var operand any = c.GetNumber()
	switch c.GetTarget() {
	case fencerv1.Compare_TARGET_VALUE:
		cmp, operand = clientv3.Value(key), string(c.GetValue())
	case fencerv1.Compare_TARGET_VERSION:
		cmp = clientv3.Version(key)
	case fencerv1.Compare_TARGET_CREATE_REVISION:
		cmp = clientv3.CreateRevision(key)
	default:
		cmp = clientv3.ModRevision(key)
	}
	return clientv3.Compare(cmp, compareResults[c.GetResult()], operand)
}

var compareResults = map[fencerv1.Compare_Result]string{
	fencerv1.Compare_RESULT_EQUAL:     "=",
	fencerv1.Compare_RESULT_NOT_EQUAL: "!=",
	fencerv1.Compare_RESULT_GREATER:   ">",
	fencerv1.Compare_RESULT_LESS:      "<",
}

// ops turns validated Ops into etcd Ops on data keys.
func (s *Server) ops(in []*fencerv1.Op) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(in))
	for _, op := range in {
		switch o := op.GetOp().(type) {
		case *fencerv1.Op_Put:
			out = append(out, clientv3.OpPut(s.store.DataKey(o.Put.GetKey()), string(o.Put.GetValue())))
		case *fencerv1.Op_Delete:
			out = append(out, clientv3.OpDelete(s.store.DataKey(o.Delete.GetKey())))
		case *fencerv1.Op_Get:
			out = append(out, clientv3.OpGet(s.store.DataKey(o.Get.GetKey())))
		}
	}
	return out
}

func opResult(r *etcdserverpb.ResponseOp) *fencerv1.OpResult {
	switch {
	case r.GetResponsePut() != nil:
		return &fencerv1.OpResult{Result: &fencerv1.OpResult_Put{Put: &fencerv1.PutResponse{Revision: r.GetResponsePut().GetHeader().GetRevision()}}}
	case r.GetResponseDeleteRange() != nil:
		return &fencerv1.OpResult{Result: &fencerv1.OpResult_Delete{Delete: &fencerv1.DeleteResponse{Deleted: r.GetResponseDeleteRange().GetDeleted() > 0}}}
	default:
		g := &fencerv1.GetResponse{}
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) == 1 {
			g = &fencerv1.GetResponse{Found: true, Value: kvs[0].Value, CreateRevision: kvs[0].CreateRevision, ModRevision: kvs[0].ModRevision}
		}
		return &fencerv1.OpResult{Result: &fencerv1.OpResult_Get{Get: g}}
	}
}

// ListLeases implements FencerService.ListLeases: one page of
// etcdstore's ListPage. The page token encodes the name of the page's last
// lease.
func (s *Server) ListLeases(ctx context.Context, req *fencerv1.ListLeasesRequest) (*fencerv1.ListLeasesResponse, error) {
	size, after, err := validateListLeases(req)
	if err != nil {
		return nil, err
	}
	principal := principalOf(ctx)
	out := &fencerv1.ListLeasesResponse{}
	for len(out.Leases) < size {
		page, more, err := s.store.ListPage(ctx, after, size-len(out.Leases), etcdstore.WithNamePrefix(req.GetNamePrefix()))
		if err != nil {
			return nil, err
		}
		for _, st := range page {
			after = st.Name
			if s.authz != nil && !s.authz.Allowed(principal, "lease", st.Name) {
				continue
			}
			ls := &fencerv1.LeaseStatus{Name: st.Name, Epoch: st.Epoch, LockDelayMs: st.LockDelay.Milliseconds(), LockDelayStarted: st.LockDelayStarted}
			if !st.Token.IsZero() {
				ls.Held, ls.Holder, ls.Token = true, st.Holder, st.Token.String()
				if principalOfHolder(st.Holder) != principal {
					ls.Holder = otherPrincipal
				}
			}
			out.Leases = append(out.Leases, ls)
		}
		if !more {
			return out, nil
		}
	}
	// A page token names the last lease returned, never one the caller may
	// not see: leases skipped for the caller are read again on the next page.
	out.NextPageToken = encodePageToken(out.Leases[len(out.Leases)-1].Name)
	return out, nil
}

// rejected counts a token rejection for the metrics, writes its audit
// record, and returns err. Other errors pass through.
func (s *Server) rejected(ctx context.Context, op string, tok token.Token, err error) error {
	var stale *token.StaleError
	var foreign *token.ForeignLeaseError
	var reason string
	switch {
	case errors.As(err, &stale):
		reason = "stale"
	case errors.As(err, &foreign):
		reason = "foreign_lease"
	case errors.Is(err, ErrPermissionDenied):
		reason = "permission"
	default:
		return err
	}
	s.m.rejections.WithLabelValues(reason).Inc()
	s.audit.LogAttrs(ctx, slog.LevelWarn, "refused", slog.String("op", op), slog.String("principal", principalOf(ctx)),
		slog.String("lease", tok.Lease), slog.String("token", tok.String()), slog.String("reason", reason), slog.Any("err", err))
	return err
}
