package server

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// FuzzValidateRequests decodes arbitrary bytes as each request type and
// validates them. Validation must never panic, and whatever it accepts must
// satisfy the store's own checks, so that nothing invalid reaches etcd.
// Check and Get leave their checks to the store's Check and Get, which
// make them before they send anything: the server only parses Check's
// token.
func FuzzValidateRequests(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&fencerv1.PutRequest{Token: "v1:1:5:jobs", Key: "a/b", Value: []byte("v")})
	seed(&fencerv1.AcquireRequest{Name: "jobs", TtlSeconds: 5, Wait: true})
	seed(&fencerv1.TxnRequest{Token: "v1:2:9:x", Compares: []*fencerv1.Compare{{Key: "k", Target: fencerv1.Compare_TARGET_MOD_REVISION, Result: fencerv1.Compare_RESULT_LESS, Number: 3}},
		Success: []*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "k"}}}, {Op: &fencerv1.Op_Delete{Delete: &fencerv1.DeleteOp{Key: "j"}}}}})
	seed(&fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: 7}})
	seed(&fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: "v1:1:2:a"}, HolderSessionId: 7, HolderSessionSecret: make([]byte, 32)})
	seed(&fencerv1.WatchLeaseRequest{SessionId: 1, StartRevision: -1})
	seed(&fencerv1.PutManyRequest{Puts: []*fencerv1.PutRequest{{Token: "v1:1:5:jobs", Key: "a", Value: []byte("v")}, {Token: "v1:1:5:jobs", Key: "b"}}})
	seed(&fencerv1.AcquireRequest{Name: "ring:orders:7"})
	seed(&fencerv1.CreateRingRequest{Ring: "orders", ShardCount: 16})
	seed(&fencerv1.CreateRingRequest{Ring: "orders", Shards: []string{"eu", "us", "eu"}})
	seed(&fencerv1.JoinRingRequest{Ring: "orders", SessionId: 7, Member: "worker-1", DrainSeconds: 30})
	seed(&fencerv1.JoinRingRequest{Ring: "orders", TtlSeconds: 10})
	seed(&fencerv1.ReleaseShardsRequest{Ring: "orders", SessionId: 7, Shards: []string{"1", "2"}})
	seed(&fencerv1.LeaveRingRequest{Ring: "orders", SessionId: 7})
	seed(&fencerv1.OwnsRequest{Ring: "orders", SessionId: 7, Shard: "3"})
	seed(&fencerv1.RingStatusRequest{Ring: "Orders"})
	seed(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{WatchId: 3, Watch: &fencerv1.WatchLeaseRequest{SessionId: 7, StartRevision: 9}}}})
	seed(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{Renew: &fencerv1.KeepAliveRequest{SessionId: 7}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		storeToken := func(tok token.Token) {
			if err := tok.Validate(); err != nil {
				t.Fatalf("accepted invalid token %v: %v", tok, err)
			}
			if err := etcdstore.ValidateName("lease", tok.Lease); err != nil {
				t.Fatalf("accepted token of invalid lease %q", tok.Lease)
			}
		}
		keyOK := func(k string) {
			if err := etcdstore.ValidateKey(k); err != nil {
				t.Fatalf("accepted invalid key %q", k)
			}
		}
		var put fencerv1.PutRequest
		if proto.Unmarshal(b, &put) == nil {
			if in, err := validatePut(&put); err == nil {
				storeToken(in.Token())
				keyOK(put.GetKey())
				if len(put.GetValue()) > etcdstore.MaxValueLen {
					t.Fatal("accepted oversized value")
				}
			}
		}
		var many fencerv1.PutManyRequest
		if proto.Unmarshal(b, &many) == nil && validatePutMany(&many) == nil {
			if n := len(many.GetPuts()); n < 1 || n > MaxPutMany {
				t.Fatalf("accepted PutMany of %d puts", n)
			}
		}
		var acq fencerv1.AcquireRequest
		if proto.Unmarshal(b, &acq) == nil && validateAcquire(&acq) == nil {
			if etcdstore.ValidateName("name", acq.GetName()) != nil || acq.GetTtlSeconds() < 0 || acq.GetTtlSeconds() > MaxTTLSeconds || acq.GetSessionId() < 0 {
				t.Fatalf("accepted invalid acquire %v", &acq)
			}
		}
		var txn fencerv1.TxnRequest
		if proto.Unmarshal(b, &txn) == nil {
			if in, err := validateTxn(&txn); err == nil {
				storeToken(in.Token())
				for _, c := range txn.GetCompares() {
					keyOK(c.GetKey())
					if _, ok := compareResults[c.GetResult()]; !ok {
						t.Fatalf("accepted compare result %v", c.GetResult())
					}
				}
				for _, op := range append(txn.GetSuccess(), txn.GetFailure()...) {
					if op.GetOp() == nil {
						t.Fatal("accepted empty op")
					}
				}
			}
		}
		var rel fencerv1.ReleaseRequest
		if proto.Unmarshal(b, &rel) == nil {
			if in, err := validateRelease(&rel); err == nil && in.Token().IsZero() && rel.GetSessionId() <= 0 {
				t.Fatalf("accepted release %v", &rel)
			}
		}
		if acq.GetName() != "" && validateAcquire(&acq) == nil && strings.HasPrefix(acq.GetName(), ring.LeasePrefix) {
			t.Fatalf("accepted acquisition of a ring's shard lease %q", acq.GetName())
		}
		ringOK := func(name string) {
			if ring.ValidateRing(name) != nil {
				t.Fatalf("accepted invalid ring %q", name)
			}
		}
		shardOK := func(name string) {
			if ring.ValidateShard(name) != nil {
				t.Fatalf("accepted invalid shard %q", name)
			}
		}
		var create fencerv1.CreateRingRequest
		if proto.Unmarshal(b, &create) == nil {
			if shards, err := validateCreateRing(&create); err == nil {
				ringOK(create.GetRing())
				if len(shards) < 1 || len(shards) > ring.MaxShards || (create.GetShardCount() != 0) == (len(create.GetShards()) != 0) {
					t.Fatalf("accepted create of %d shards (count %d, %d named)", len(shards), create.GetShardCount(), len(create.GetShards()))
				}
				seen := map[string]bool{}
				for _, sh := range shards {
					shardOK(sh)
					if seen[sh] {
						t.Fatalf("accepted shard %q twice", sh)
					}
					seen[sh] = true
				}
			}
		}
		var join fencerv1.JoinRingRequest
		if proto.Unmarshal(b, &join) == nil && validateJoinRing(&join) == nil {
			ringOK(join.GetRing())
			if join.GetMember() != "" && ring.ValidateMember(join.GetMember()) != nil {
				t.Fatalf("accepted invalid member %q", join.GetMember())
			}
			if join.GetSessionId() < 0 || join.GetTtlSeconds() < 0 || join.GetTtlSeconds() > MaxTTLSeconds || (join.GetSessionId() > 0 && join.GetTtlSeconds() != 0) ||
				join.GetDrainSeconds() < 0 || join.GetDrainSeconds() > MaxDrainSeconds {
				t.Fatalf("accepted join %v", &join)
			}
		}
		var rel2 fencerv1.ReleaseShardsRequest
		if proto.Unmarshal(b, &rel2) == nil && validateReleaseShards(&rel2) == nil {
			ringOK(rel2.GetRing())
			if rel2.GetSessionId() <= 0 || len(rel2.GetShards()) < 1 || len(rel2.GetShards()) > MaxReleaseShards {
				t.Fatalf("accepted release of shards %v", &rel2)
			}
			for _, sh := range rel2.GetShards() {
				shardOK(sh)
			}
		}
		var leave fencerv1.LeaveRingRequest
		if proto.Unmarshal(b, &leave) == nil && validateLeaveRing(&leave) == nil {
			ringOK(leave.GetRing())
			if leave.GetSessionId() <= 0 {
				t.Fatalf("accepted leave %v", &leave)
			}
		}
		var owns fencerv1.OwnsRequest
		if proto.Unmarshal(b, &owns) == nil && validateOwns(&owns) == nil {
			ringOK(owns.GetRing())
			shardOK(owns.GetShard())
			if owns.GetSessionId() <= 0 {
				t.Fatalf("accepted owns %v", &owns)
			}
		}
		var rst fencerv1.RingStatusRequest
		if proto.Unmarshal(b, &rst) == nil && validateRingStatus(&rst) == nil {
			ringOK(rst.GetRing())
		}
		var w fencerv1.WatchLeaseRequest
		if proto.Unmarshal(b, &w) == nil && validateWatchLease(&w) == nil && (w.GetSessionId() <= 0 || w.GetStartRevision() < 0) {
			t.Fatalf("accepted watch %v", &w)
		}
		var sr fencerv1.SessionsRequest
		if proto.Unmarshal(b, &sr) == nil && validateSessions(&sr) == nil {
			switch r := sr.GetRequest().(type) {
			case *fencerv1.SessionsRequest_Renew:
				if r.Renew.GetSessionId() <= 0 {
					t.Fatalf("accepted renewal %v", &sr)
				}
			case *fencerv1.SessionsRequest_Watch:
				if w := r.Watch.GetWatch(); r.Watch.GetWatchId() <= 0 || w.GetSessionId() <= 0 || w.GetStartRevision() < 0 || validateWatchLease(w) != nil {
					t.Fatalf("accepted watch %v", &sr)
				}
			case *fencerv1.SessionsRequest_Unwatch:
				if r.Unwatch.GetWatchId() <= 0 {
					t.Fatalf("accepted unwatch %v", &sr)
				}
			default:
				t.Fatalf("accepted empty request %v", &sr)
			}
		}
		for _, m := range []proto.Message{&fencerv1.CheckRequest{}, &fencerv1.AdvanceRequest{}, &fencerv1.DeleteRequest{}, &fencerv1.KeepAliveRequest{}, &fencerv1.ListLeasesRequest{}, &fencerv1.ListKeysRequest{}} {
			if proto.Unmarshal(b, m) != nil {
				continue
			}
			switch m := m.(type) {
			case *fencerv1.CheckRequest:
				if tok, err := validateCheck(m); err == nil {
					if err := tok.Validate(); err != nil {
						t.Fatalf("accepted invalid token %v: %v", tok, err)
					}
				}
			case *fencerv1.AdvanceRequest:
				if in, err := validateAdvance(m); err == nil {
					storeToken(in.Token())
					if etcdstore.ValidateName("resource", m.GetResource()) != nil {
						t.Fatalf("accepted invalid resource %q", m.GetResource())
					}
				}
			case *fencerv1.DeleteRequest:
				if in, err := validateDelete(m); err == nil {
					storeToken(in.Token())
					keyOK(m.GetKey())
				}
			case *fencerv1.KeepAliveRequest:
				if validateKeepAlive(m) == nil && m.GetSessionId() <= 0 {
					t.Fatal("accepted session id <= 0")
				}
			case *fencerv1.ListLeasesRequest:
				if size, after, err := validateListLeases(m); err == nil {
					if size < 1 || size > MaxListPageSize {
						t.Fatalf("accepted page size %d", size)
					}
					if (after == "") != (m.GetPageToken() == "") || encodePageToken(after) != m.GetPageToken() {
						t.Fatalf("page token %q decoded to %q", m.GetPageToken(), after)
					}
				}
			case *fencerv1.ListKeysRequest:
				if _, _, err := validateListKeys(m); err == nil && m.GetPrefix() != "" {
					keyOK(m.GetPrefix())
				}
			}
		}
	})
}

// FuzzParseAuthorization checks that any input either parses into an
// Authorization whose decisions are consistent (write implies read, an
// unlisted principal may do nothing) or fails with an error, never a
// panic.
func FuzzParseAuthorization(f *testing.F) {
	f.Add([]byte("principals:\n  alice:\n    leases: [\"orders*\"]\n    write: [\"orders/*\"]\n"))
	f.Add([]byte(`{"principals":{"bob":{"read":["*"]}}}`))
	f.Add([]byte("principals:\n  alice:\n    leases: [\"a*b\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseAuthorization(data)
		if err != nil {
			return
		}
		for _, name := range []string{"", "orders", "orders/1", "x"} {
			if a.Allowed("alice", "write", name) && !a.Allowed("alice", "read", name) {
				t.Fatalf("write without read for %q", name)
			}
			for _, kind := range []string{"lease", "read", "write", "resource"} {
				if a.Allowed("no such principal/", kind, name) {
					t.Fatalf("an unlisted principal may %s %q", kind, name)
				}
			}
		}
	})
}

// FuzzParseTokenFile checks that any token file either fails to parse or
// yields tokens that each authenticate as the valid principal on their
// line, never a panic.
func FuzzParseTokenFile(f *testing.F) {
	f.Add([]byte("# tokens\nalice-token-0123456789 alice\n\nbob-token-0123456789ab\tbob\n"))
	f.Add([]byte("short alice\n"))
	f.Add([]byte("alice-token-0123456789 alice extra\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := parseTokenFile("tokens", bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(b.principals) == 0 {
			t.Fatal("parsed a file without tokens")
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			if len(fields) != 2 || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+fields[0]))
			p, err := b.Authenticate(ctx)
			if err != nil || p != fields[1] {
				t.Fatalf("token of line %q authenticates as %q, %v", line, p, err)
			}
			if err := ValidatePrincipal(p); err != nil {
				t.Fatalf("invalid principal accepted: %v", err)
			}
		}
	})
}
