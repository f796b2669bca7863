package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// Input limits beyond etcdstore's (names, keys and values). docs/service.md
// lists them all.
const (
	// MaxTTLSeconds is the longest session TTL a client may ask for.
	MaxTTLSeconds = 3600
	// MaxLockDelaySeconds is the longest lock-delay a client may ask for
	// (etcdstore.MaxLockDelay).
	MaxLockDelaySeconds = 3600
	// SessionSecretLen is the length in bytes of a session's secret
	// (AcquireResponse.session_secret).
	SessionSecretLen = 32
	// DefaultTTLSeconds is the TTL of a session opened with ttl_seconds 0.
	DefaultTTLSeconds = 10
	// MaxTxnCompares is the most compares a Txn may carry.
	MaxTxnCompares = 64
	// MaxTxnOps is the most operations each Txn branch may carry. A Txn at
	// this limit needs an etcd with --max-txn-ops of at least
	// embedetcd.MaxTxnOps (258); on etcd's default of 128, etcd itself
	// refuses smaller Txns with too_many_ops.
	MaxTxnOps = 64
	// MaxPutMany is the most puts a PutMany call may carry.
	MaxPutMany = 128
	// MaxListPageSize is the largest page ListLeases and ListKeys return.
	MaxListPageSize = 5000
	// DefaultListPageSize is the page size of a ListLeases or ListKeys
	// request with page_size 0.
	DefaultListPageSize = 500
	// MaxRequestBytes is the largest request message the server accepts.
	// etcd's own request limit (1.5 MiB by default) applies to what a
	// request writes.
	MaxRequestBytes = 2 << 20
)

// The validators below are pure: they check a request against the limits
// and return its parsed parts, or an error naming the offending field
// (wrapping *token.ArgumentError or *token.MalformedError). Nothing is
// sent to etcd for a request that fails them.

func invalidArg(field, value, reason string) error {
	return &fieldError{field: field, err: token.InvalidArgument(field, value, reason)}
}

// parseToken parses a token field, leaving the check that the store could
// have issued it (its lease name) to etcdstore's CheckToken and the like
// (see storeInput).
func parseToken(field, s string) (token.Token, error) {
	if s == "" {
		return token.Token{}, invalidArg(field, s, "required")
	}
	tok, err := token.Parse(s)
	if err != nil {
		return token.Token{}, inField(field, err)
	}
	return tok, nil
}

// storeInput turns an error of etcdstore's checks of a request's token,
// keys, values and resources (its Check* functions, or the checks of a
// call such as Get) into the service's: an argument error is tied to the
// request field of the same name ("key", "value", "resource"), and a
// token lease the store refuses, which token.Parse accepted (one with "/"
// or longer than token.MaxNameLen), is the invalid argument "lease" of the
// field "token", as the service has always reported it. Other errors pass
// through.
func storeInput(err error) error {
	if me, ok := errors.AsType[*token.MalformedError](err); ok && me.Field == "lease" {
		return &fieldError{field: "token", err: token.InvalidArgument("lease", me.Input, me.Reason)}
	}
	if ae, ok := errors.AsType[*token.ArgumentError](err); ok {
		return inField(ae.Arg, err)
	}
	return err
}

func validateName(field, name string) error {
	return inField(field, token.ValidateName(field, name))
}

// validateKey checks a key of a request that etcdstore does not check
// itself (a Txn's compares and ops, a ListKeys prefix).
func validateKey(field, key string) error {
	if err := etcdstore.ValidateKey(key); err != nil {
		return inField(field, err)
	}
	return nil
}

func validateValue(field string, v []byte) error {
	return inField(field, etcdstore.ValidateValue(v))
}

// validateID checks an id field (a session_id, a watch_id): positive.
func validateID(field string, id int64) error {
	if id <= 0 {
		return invalidArg(field, strconv.FormatInt(id, 10), "must be positive")
	}
	return nil
}

// validateSessionTTL checks the session_id and ttl_seconds of a call that
// opens a session when session_id is 0 (Acquire, JoinRing).
func validateSessionTTL(id, ttl int64) error {
	switch {
	case id < 0:
		return invalidArg("session_id", strconv.FormatInt(id, 10), "must not be negative")
	case id > 0 && ttl != 0:
		return invalidArg("ttl_seconds", strconv.FormatInt(ttl, 10), "must be 0 when session_id is set")
	case ttl < 0 || ttl > MaxTTLSeconds:
		return invalidArg("ttl_seconds", strconv.FormatInt(ttl, 10), "must be 0 to "+strconv.Itoa(MaxTTLSeconds))
	}
	return nil
}

// validateAcquire checks an AcquireRequest.
func validateAcquire(r *fencerv1.AcquireRequest) error {
	if err := validateName("name", r.GetName()); err != nil {
		return err
	}
	if err := notRingLease("name", r.GetName()); err != nil {
		return err
	}
	if err := validateSessionTTL(r.GetSessionId(), r.GetTtlSeconds()); err != nil {
		return err
	}
	if d := r.GetLockDelaySeconds(); d < 0 || d > MaxLockDelaySeconds {
		return invalidArg("lock_delay_seconds", strconv.FormatInt(d, 10), "must be 0 to "+strconv.Itoa(MaxLockDelaySeconds))
	}
	return nil
}

// validateKeepAlive checks a KeepAliveRequest.
func validateKeepAlive(r *fencerv1.KeepAliveRequest) error {
	return validateID("session_id", r.GetSessionId())
}

// validateRelease checks a ReleaseRequest and returns its token, checked
// for ReleaseChecked (etcdstore.CheckToken), or the zero Checked, whose
// token is zero, when the request releases a session.
func validateRelease(r *fencerv1.ReleaseRequest) (etcdstore.Checked, error) {
	switch t := r.GetTarget().(type) {
	case *fencerv1.ReleaseRequest_Token:
		secret := r.GetHolderSessionSecret()
		if id := r.GetHolderSessionId(); id != 0 {
			if err := validateID("holder_session_id", id); err != nil {
				return etcdstore.Checked{}, err
			}
			if len(secret) != SessionSecretLen {
				return etcdstore.Checked{}, invalidArg("holder_session_secret", fmt.Sprintf("%d bytes", len(secret)),
					"must be the "+strconv.Itoa(SessionSecretLen)+"-byte session_secret of the Acquire that opened holder_session_id")
			}
		} else if len(secret) != 0 {
			return etcdstore.Checked{}, invalidArg("holder_session_secret", fmt.Sprintf("%d bytes", len(secret)), "must be empty without holder_session_id")
		}
		tok, err := parseToken("token", t.Token)
		if err != nil {
			return etcdstore.Checked{}, err
		}
		c, err := etcdstore.CheckToken(tok)
		if err != nil {
			return etcdstore.Checked{}, storeInput(err)
		}
		if err := notRingLease("token", tok.Lease); err != nil {
			return etcdstore.Checked{}, err
		}
		return c, nil
	case *fencerv1.ReleaseRequest_SessionId:
		if id := r.GetHolderSessionId(); id != 0 {
			return etcdstore.Checked{}, invalidArg("holder_session_id", strconv.FormatInt(id, 10), "must be 0 when session_id is set")
		}
		if n := len(r.GetHolderSessionSecret()); n != 0 {
			return etcdstore.Checked{}, invalidArg("holder_session_secret", fmt.Sprintf("%d bytes", n), "must be empty when session_id is set")
		}
		return etcdstore.Checked{}, validateID("session_id", t.SessionId)
	default:
		return etcdstore.Checked{}, invalidArg("target", "", "one of token or session_id is required")
	}
}

// validateCheck parses a CheckRequest's token. etcdstore's Check checks
// its lease name (see storeInput).
func validateCheck(r *fencerv1.CheckRequest) (token.Token, error) {
	return parseToken("token", r.GetToken())
}

// validateAdvance checks an AdvanceRequest, with etcdstore.CheckAdvance,
// and returns its input checked for AdvanceChecked.
func validateAdvance(r *fencerv1.AdvanceRequest) (etcdstore.Checked, error) {
	tok, err := parseToken("token", r.GetToken())
	if err != nil {
		// The resource comes first, as CheckAdvance has it.
		if rerr := validateName("resource", r.GetResource()); rerr != nil {
			return etcdstore.Checked{}, rerr
		}
		return etcdstore.Checked{}, err
	}
	c, err := etcdstore.CheckAdvance(r.GetResource(), tok)
	return c, storeInput(err)
}

// validatePut checks a PutRequest, with etcdstore.CheckPut, and returns
// its input checked for PutChecked.
func validatePut(r *fencerv1.PutRequest) (etcdstore.Checked, error) {
	tok, err := parseToken("token", r.GetToken())
	if err != nil {
		return etcdstore.Checked{}, err
	}
	c, err := etcdstore.CheckPut(tok, r.GetKey(), r.GetValue())
	return c, storeInput(err)
}

// validatePutMany checks the number of puts of a PutManyRequest; each put
// is checked on its own, as Put checks it.
func validatePutMany(r *fencerv1.PutManyRequest) error {
	if n := len(r.GetPuts()); n == 0 || n > MaxPutMany {
		return invalidArg("puts", strconv.Itoa(n)+" puts", fmt.Sprintf("must be 1 to %d puts", MaxPutMany))
	}
	return nil
}

// validateListLeases checks a ListLeasesRequest and returns its page size,
// with the default for 0, and the name its page token follows. A name
// prefix must be what the start of a valid name could be.
func validateListLeases(r *fencerv1.ListLeasesRequest) (size int, after string, err error) {
	if p := r.GetNamePrefix(); p != "" {
		if err := validateName("name_prefix", p); err != nil {
			return 0, "", err
		}
	}
	return validatePage(r.GetPageSize(), r.GetPageToken())
}

// validateListKeys checks a ListKeysRequest and returns its page size,
// with the default for 0, and the key its page token follows.
func validateListKeys(r *fencerv1.ListKeysRequest) (size int, after string, err error) {
	if p := r.GetPrefix(); p != "" {
		if err := validateKey("prefix", p); err != nil {
			return 0, "", err
		}
	}
	return validatePage(r.GetPageSize(), r.GetPageToken())
}

// validatePage checks a listing's page size and token and returns the
// size, with the default for 0, and the name the token follows.
func validatePage(pageSize int32, pageToken string) (size int, after string, err error) {
	size = int(pageSize)
	switch {
	case size < 0 || size > MaxListPageSize:
		return 0, "", invalidArg("page_size", strconv.Itoa(size), "not between 0 and "+strconv.Itoa(MaxListPageSize))
	case size == 0:
		size = DefaultListPageSize
	}
	if after, err = decodePageToken(pageToken); err != nil {
		return 0, "", err
	}
	return size, after, nil
}

// encodePageToken makes the page token that follows the lease or key
// named last. It is opaque to clients: base64url of the name, which need
// not be a valid lease name when something other than fencer wrote under
// the prefix.
func encodePageToken(last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(last))
}

// decodePageToken returns the name a page token follows, "" for none.
func decodePageToken(tok string) (string, error) {
	after, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil || (tok != "" && len(after) == 0) {
		return "", invalidArg("page_token", tok, "not a page token of a previous page")
	}
	return string(after), nil
}

// validateDelete checks a DeleteRequest, with etcdstore.CheckDelete, and
// returns its input checked for DeleteChecked.
func validateDelete(r *fencerv1.DeleteRequest) (etcdstore.Checked, error) {
	tok, err := parseToken("token", r.GetToken())
	if err != nil {
		return etcdstore.Checked{}, err
	}
	c, err := etcdstore.CheckDelete(tok, r.GetKey())
	return c, storeInput(err)
}

// validateTxn checks a TxnRequest and returns its token checked for
// TxnChecked (etcdstore.CheckToken). Besides each key and value, which
// etcdstore does not check in a Txn, it rejects a branch that writes one
// key twice, which etcd would refuse.
func validateTxn(r *fencerv1.TxnRequest) (etcdstore.Checked, error) {
	tok, err := parseToken("token", r.GetToken())
	if err != nil {
		return etcdstore.Checked{}, err
	}
	checked, err := etcdstore.CheckToken(tok)
	if err != nil {
		return etcdstore.Checked{}, storeInput(err)
	}
	if n := len(r.GetCompares()); n > MaxTxnCompares {
		return etcdstore.Checked{}, invalidArg("compares", strconv.Itoa(n), "more than "+strconv.Itoa(MaxTxnCompares))
	}
	for i, c := range r.GetCompares() {
		if err := validateCompare(fmt.Sprintf("compares[%d]", i), c); err != nil {
			return etcdstore.Checked{}, err
		}
	}
	if err := validateOps("success", r.GetSuccess()); err != nil {
		return etcdstore.Checked{}, err
	}
	if err := validateOps("failure", r.GetFailure()); err != nil {
		return etcdstore.Checked{}, err
	}
	return checked, nil
}

func validateCompare(field string, c *fencerv1.Compare) error {
	if err := validateKey(field+".key", c.GetKey()); err != nil {
		return err
	}
	switch c.GetTarget() {
	case fencerv1.Compare_TARGET_VALUE:
		if err := validateValue(field+".value", c.GetValue()); err != nil {
			return err
		}
	case fencerv1.Compare_TARGET_VERSION, fencerv1.Compare_TARGET_CREATE_REVISION, fencerv1.Compare_TARGET_MOD_REVISION:
		if c.GetNumber() < 0 {
			return invalidArg(field+".number", strconv.FormatInt(c.GetNumber(), 10), "must not be negative")
		}
	default:
		return invalidArg(field+".target", c.GetTarget().String(), "unknown or unspecified")
	}
	switch c.GetResult() {
	case fencerv1.Compare_RESULT_EQUAL, fencerv1.Compare_RESULT_NOT_EQUAL, fencerv1.Compare_RESULT_GREATER, fencerv1.Compare_RESULT_LESS:
		return nil
	default:
		return invalidArg(field+".result", c.GetResult().String(), "unknown or unspecified")
	}
}

func validateOps(branch string, ops []*fencerv1.Op) error {
	if len(ops) > MaxTxnOps {
		return invalidArg(branch, strconv.Itoa(len(ops)), "more than "+strconv.Itoa(MaxTxnOps)+" operations")
	}
	written := map[string]bool{}
	for i, op := range ops {
		field := fmt.Sprintf("%s[%d]", branch, i)
		var key string
		switch o := op.GetOp().(type) {
		case *fencerv1.Op_Put:
			key = o.Put.GetKey()
			if err := validateKey(field+".put.key", key); err != nil {
				return err
			}
			if err := validateValue(field+".put.value", o.Put.GetValue()); err != nil {
				return err
			}
		case *fencerv1.Op_Delete:
			key = o.Delete.GetKey()
			if err := validateKey(field+".delete.key", key); err != nil {
				return err
			}
		case *fencerv1.Op_Get:
			if err := validateKey(field+".get.key", o.Get.GetKey()); err != nil {
				return err
			}
			continue
		default:
			return invalidArg(field, "", "one of put, delete or get is required")
		}
		if written[key] {
			return invalidArg(field, key, "writes a key already written in this branch")
		}
		written[key] = true
	}
	return nil
}

// validateWatchLease checks a WatchLeaseRequest.
func validateWatchLease(r *fencerv1.WatchLeaseRequest) error {
	if err := validateID("session_id", r.GetSessionId()); err != nil {
		return err
	}
	if r.GetStartRevision() < 0 {
		return invalidArg("start_revision", strconv.FormatInt(r.GetStartRevision(), 10), "must not be negative")
	}
	return nil
}

// Limits of the ring calls beyond package ring's (names, MaxShards).
const (
	// MaxReleaseShards is the most shards a ReleaseShards call may hand off.
	MaxReleaseShards = 1000
	// MaxDrainSeconds is the longest drain time a JoinRing may ask for.
	MaxDrainSeconds = 600
	// DefaultDrainSeconds is the drain time of a JoinRing with
	// drain_seconds 0.
	DefaultDrainSeconds = 5
)

// validateRing checks a ring name.
func validateRing(field, name string) error {
	return inField(field, ring.ValidateRing(name))
}

// validateCreateRing checks a CreateRingRequest and returns its shard
// names: shard_count's "0" to "<shard_count-1>", or shards.
func validateCreateRing(r *fencerv1.CreateRingRequest) ([]string, error) {
	if err := validateRing("ring", r.GetRing()); err != nil {
		return nil, err
	}
	count, shards := r.GetShardCount(), r.GetShards()
	switch {
	case count != 0 && len(shards) != 0:
		return nil, invalidArg("shards", strconv.Itoa(len(shards))+" shards", "must be empty when shard_count is set")
	case count == 0 && len(shards) == 0:
		return nil, invalidArg("shard_count", "0", "one of shard_count or shards is required")
	case count < 0 || count > ring.MaxShards:
		return nil, invalidArg("shard_count", strconv.Itoa(int(count)), "must be 1 to "+strconv.Itoa(ring.MaxShards))
	case len(shards) > ring.MaxShards:
		return nil, invalidArg("shards", strconv.Itoa(len(shards))+" shards", "must be 1 to "+strconv.Itoa(ring.MaxShards)+" shards")
	}
	if count > 0 {
		names := make([]string, count)
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
		return names, nil
	}
	seen := make(map[string]bool, len(shards))
	for i, s := range shards {
		field := fmt.Sprintf("shards[%d]", i)
		if err := inField(field, ring.ValidateShard(s)); err != nil {
			return nil, err
		}
		if seen[s] {
			return nil, invalidArg(field, s, "names a shard already listed")
		}
		seen[s] = true
	}
	return shards, nil
}

// validateJoinRing checks a JoinRingRequest.
func validateJoinRing(r *fencerv1.JoinRingRequest) error {
	if err := validateRing("ring", r.GetRing()); err != nil {
		return err
	}
	if err := validateSessionTTL(r.GetSessionId(), r.GetTtlSeconds()); err != nil {
		return err
	}
	if m := r.GetMember(); m != "" {
		if err := inField("member", ring.ValidateMember(m)); err != nil {
			return err
		}
	}
	if d := r.GetDrainSeconds(); d < 0 || d > MaxDrainSeconds {
		return invalidArg("drain_seconds", strconv.FormatInt(d, 10), "must be 0 to "+strconv.Itoa(MaxDrainSeconds))
	}
	return nil
}

// validateReleaseShards checks a ReleaseShardsRequest.
func validateReleaseShards(r *fencerv1.ReleaseShardsRequest) error {
	if err := validateRing("ring", r.GetRing()); err != nil {
		return err
	}
	if err := validateID("session_id", r.GetSessionId()); err != nil {
		return err
	}
	shards := r.GetShards()
	if n := len(shards); n == 0 || n > MaxReleaseShards {
		return invalidArg("shards", strconv.Itoa(n)+" shards", fmt.Sprintf("must be 1 to %d shards", MaxReleaseShards))
	}
	for i, s := range shards {
		if err := inField(fmt.Sprintf("shards[%d]", i), ring.ValidateShard(s)); err != nil {
			return err
		}
	}
	return nil
}

// validateLeaveRing checks a LeaveRingRequest.
func validateLeaveRing(r *fencerv1.LeaveRingRequest) error {
	if err := validateRing("ring", r.GetRing()); err != nil {
		return err
	}
	return validateID("session_id", r.GetSessionId())
}

// validateOwns checks an OwnsRequest.
func validateOwns(r *fencerv1.OwnsRequest) error {
	if err := validateRing("ring", r.GetRing()); err != nil {
		return err
	}
	if err := validateID("session_id", r.GetSessionId()); err != nil {
		return err
	}
	return inField("shard", ring.ValidateShard(r.GetShard()))
}

// validateRingStatus checks a RingStatusRequest.
func validateRingStatus(r *fencerv1.RingStatusRequest) error {
	return validateRing("ring", r.GetRing())
}

// notRingLease refuses a lease name of a ring's shard in a call that
// names leases directly (Acquire, Release of a token): only a ring's
// members hold them, through JoinRing.
func notRingLease(field, name string) error {
	if strings.HasPrefix(name, ring.LeasePrefix) {
		return invalidArg(field, name, "lease names starting with \""+ring.LeasePrefix+"\" belong to rings: join the ring (JoinRing) to hold its shards, and hand them off with ReleaseShards")
	}
	return nil
}

// validateSessions checks a SessionsRequest.
func validateSessions(r *fencerv1.SessionsRequest) error {
	switch q := r.GetRequest().(type) {
	case *fencerv1.SessionsRequest_Renew:
		return validateID("renew.session_id", q.Renew.GetSessionId())
	case *fencerv1.SessionsRequest_Watch:
		if err := validateID("watch.watch_id", q.Watch.GetWatchId()); err != nil {
			return err
		}
		w := q.Watch.GetWatch()
		if err := validateID("watch.watch.session_id", w.GetSessionId()); err != nil {
			return err
		}
		if w.GetStartRevision() < 0 {
			return invalidArg("watch.watch.start_revision", strconv.FormatInt(w.GetStartRevision(), 10), "must not be negative")
		}
		return nil
	case *fencerv1.SessionsRequest_Unwatch:
		return validateID("unwatch.watch_id", q.Unwatch.GetWatchId())
	}
	return invalidArg("request", "", "must set renew, watch or unwatch")
}
