"""Rings: a named, fixed set of shards that members divide among themselves,
each shard held with a fencing token.

    with client.join("orders", member="worker-1") as ring:
        for change in ring.changes():
            if change.kind == fencer.GAINED:
                change.shard.put("orders/%s/x" % change.shard.name, b"...")
            elif change.kind == fencer.LOSING:
                change.shard.release()      # stopped acting for it: hand it off

Client.join makes the client's session a member of a ring and follows the
member's JoinRing stream on a thread of its own: the server acquires each
shard assigned to the member as a lease named "ring:<ring>:<shard>" through
the session, and reports it GAINED with its token; a shard assigned to
another member is reported LOSING (stop acting for it, then release it),
and one that ended LOST. A Shard's put, delete, txn and check carry its
token, exactly as a Lease's do, so etcd refuses them once the shard has
moved on: that check, not the events, is the guarantee. The events are
advisory: a member learns of a loss only when it reads it.

The stream is reopened after UNAVAILABLE (a restarted server, a broken
connection) with jittered backoff, with the member's session: its first
message is a new snapshot, which is compared with what the member had, and
the differences are reported as GAINED and LOST. While no stream is open
the member keeps what it holds, gains nothing and hands nothing off. When
the session ends (its keepalive failed for a TTL, or the server reports it
gone) every shard is reported LOST and changes() raises SessionNotFoundError.
"""

import collections
import queue
import threading
import time

import grpc

from fencer import errors
from fencer.client import _Backoff, _Guarded
from fencer.v1 import fencer_pb2

GAINED = "gained"
LOSING = "losing"
LOST = "lost"

_KINDS = {
    fencer_pb2.ShardChange.KIND_GAINED: GAINED,
    fencer_pb2.ShardChange.KIND_LOSING: LOSING,
    fencer_pb2.ShardChange.KIND_LOST: LOST,
}

# ReleaseShardsRequest takes at most this many shards.
_RELEASE_BATCH = 1000

_END = object()  # the last item of a ring's change queue

RingMember = collections.namedtuple("RingMember", "member holder leaving owned")
RingMember.__doc__ = """One member of a ring: its name, its session's holder
identity, whether it is leaving, and how many shards it owns."""


class RingStatus(collections.namedtuple("RingStatus", "shard_count members unowned revision")):
    """A ring's state at one etcd revision: the number of its shards, its
    members (RingMember, ordered by name), and how many shards no member
    owns."""

    __slots__ = ()

    @classmethod
    def _of(cls, resp):
        return cls(resp.shard_count, [RingMember(m.member, m.holder, m.leaving, m.owned) for m in resp.members],
                   resp.unowned, resp.revision)


Change = collections.namedtuple("Change", "kind shard drain")
Change.__doc__ = """One change of a member's shards: kind is GAINED, LOSING
or LOST; shard the Shard (for LOST, the handle whose token has ended);
drain, for LOSING, the seconds until the server releases the shard
without Shard.release (else None)."""


class Shard(_Guarded):
    """One acquisition of one shard by a member. token is fixed for its
    lifetime (a shard gained again is a new Shard); put, delete, txn and
    check carry it, and raise StaleError once the shard has moved on.
    losing is set when the shard is reported LOSING, lost (with
    lost_reason) when the member no longer owns it. Both are advisory."""

    def __init__(self, ring, name, token):
        super().__init__(ring._client, name, token)
        self.ring = ring
        self.losing = threading.Event()

    def release(self):
        """Hands the shard off, saying that this member has stopped acting
        for it (ReleaseShards), and returns whether it was released now. It
        must have been reported LOSING: a shard the member still keeps
        raises NotHeldError (metadata["cause"] "not_losing") and stays. A
        handle the member no longer owns releases nothing."""
        return self.ring.release(self) == 1

    def __repr__(self):
        return "Shard(%r, %r)" % (self.name, self.token)


class Ring:
    """A client's membership of a ring, made by Client.join; a context
    manager that leaves the ring. Its methods are safe to call from several
    threads, but changes() has one reader. name, member and session_id are
    fixed once join returns; done is set when the ring has ended, and error
    then says why (None: the member left).

    Invariants, under _mu: the view holds exactly the shards whose GAINED
    has been queued and whose LOST has not; changes are queued in the
    order they are applied, so a reader sees every shard's GAINED before
    its LOSING and LOST; once done is set nothing more is queued, the view
    is empty and _END is the queue's last item. Server calls (release,
    leave) are made without _mu.
    """

    def __init__(self, client, name, member, drain):
        self._client = client
        self.name = name
        self.member = member
        self._drain = drain
        self.session_id = 0
        self._mu = threading.Lock()
        self._view = {}  # shard name -> Shard the member owns
        self._changes = queue.Queue()
        self._call = None
        self._leaving = False
        self.done = threading.Event()
        self.error = None

    @classmethod
    def _join(cls, client, name, member, drain, sid):
        """Makes the first JoinRing call, reads its snapshot within the
        client's timeout, adopts the session it opened (sid 0) and starts
        following the stream."""
        r = cls(client, name, member, drain)
        sent = time.monotonic()
        call, batches, first = r._open(sid)
        if sid == 0:
            client._opened(first.session_id, first.session_secret, first.ttl_seconds, sent, first.revision)
        r.session_id = first.session_id or sid
        r.member = first.member or member
        with client._mu:
            if name in client._rings:
                call.cancel()
                raise ValueError("this client is already a member of ring %r" % name)
            client._rings[name] = r
        r._apply(first)
        t = threading.Thread(target=r._follow, args=(batches,), daemon=True, name="fencer-ring-" + name)
        t.start()
        client._threads.append(t)
        return r

    def _open(self, sid):
        """Opens a JoinRing stream through session sid and returns it, its
        batches (_batches) and the first batch, which must come within the
        client's timeout."""
        req = fencer_pb2.JoinRingRequest(ring=self.name, session_id=sid, member=self.member,
                                         drain_seconds=self._drain)
        if sid == 0:
            req.ttl_seconds = self._client.ttl
        c = self._client
        call = c._stub.JoinRing(req, metadata=c._md)
        self._call = call
        expired = []
        timer = threading.Timer(c.timeout, lambda: (expired.append(True), call.cancel()))
        timer.daemon = True
        timer.start()
        batches = _batches(call)
        try:
            return call, batches, next(batches)
        except grpc.RpcError as e:
            if expired:
                raise errors.UnavailableError("no answer from fencer to JoinRing within %gs" % c.timeout,
                                              code="DEADLINE_EXCEEDED") from None
            raise errors.from_rpc_error(e) from None
        except StopIteration:
            raise errors.UnavailableError("fencer ended the JoinRing stream before its snapshot") from None
        finally:
            timer.cancel()

    # -- the member's view ---------------------------------------------

    def owns(self, shard):
        """Returns the Shard of that name if this member owns it as far as
        it has heard (losing ones included), else None. Local and advisory:
        a write is fenced by the Shard's token, never by owns."""
        with self._mu:
            return self._view.get(shard)

    def check_owns(self, shard):
        """Asks the server whether this member owns shard now, and returns
        its token (a str), or None. The server that runs the member's
        stream answers from memory, another with one etcd read. Like owns,
        the answer may be stale when it arrives: a write is fenced by the
        token, never by check_owns. A shard not of the ring raises
        InvalidArgumentError."""
        resp = self._client._call(self._client._stub.Owns,
                                  fencer_pb2.OwnsRequest(ring=self.name, session_id=self.session_id, shard=shard))
        return resp.token if resp.owned else None

    def shards(self):
        """Returns the names of the shards this member owns as far as it
        has heard, sorted."""
        with self._mu:
            return sorted(self._view)

    def changes(self, timeout=None):
        """Yields the member's Changes in order, starting with a GAINED for
        every shard of the first snapshot. With timeout (seconds) it stops
        once no change has come for that long, so a loop can do other work
        and call it again; with None it runs until the membership ends.
        When it ends, after a LOST for every shard the member still had,
        changes() returns if the member left and raises the cause
        otherwise: SessionNotFoundError when the session ended (or the
        client was closed), or the server's error."""
        while True:
            try:
                item = self._changes.get(timeout=timeout)
            except queue.Empty:
                return
            if item is _END:
                self._changes.put(_END)  # every later call ends too
                if self.error is not None:
                    raise self.error
                return
            yield item

    def _emit(self, kind, shard, drain=None):
        self._changes.put(Change(kind, shard, drain))

    def _apply(self, resp):
        """Applies one stream message to the view and queues its changes.
        A snapshot replaces the view: a shard the member had with another
        token, or no longer has, is LOST; a new one GAINED."""
        release = []
        with self._mu:
            if self.done.is_set():
                return
            if resp.snapshot:
                now = {c.shard: c.token for c in resp.changes}
                for name, sh in list(self._view.items()):
                    if now.get(name) != sh.token:
                        self._lost(sh, "not in the member's snapshot")
                for name, tok in now.items():
                    if name not in self._view:
                        self._gained(name, tok)
                release = [sh.name for sh in self._view.values() if self._leaving and sh.losing.is_set()]
            else:
                for c in resp.changes:
                    kind = _KINDS.get(c.kind)
                    sh = self._view.get(c.shard)
                    if kind == GAINED:
                        if sh is not None and sh.token == c.token:
                            continue
                        if sh is not None:
                            self._lost(sh, "superseded")
                        self._gained(c.shard, c.token)
                    elif sh is None or (c.token and c.token != sh.token):
                        continue  # a change of an acquisition the view no longer has
                    elif kind == LOSING:
                        sh.losing.set()
                        self._emit(LOSING, sh, c.drain_ms / 1000.0)
                        if self._leaving:
                            release.append(sh.name)
                    elif kind == LOST:
                        self._lost(sh, "lost")
        if release:
            try:
                self._release_names(release)
            except errors.FencerError:
                pass  # the server releases them after the drain time

    def _gained(self, name, token):
        sh = Shard(self, name, token)
        self._view[name] = sh
        self._emit(GAINED, sh)

    def _lost(self, sh, reason):
        del self._view[sh.name]
        sh._lose(reason)
        self._emit(LOST, sh)

    # -- the stream ----------------------------------------------------

    def _follow(self, batches):
        """Follows the member's stream until the ring ends; a failure of the
        follower itself ends the ring rather than leave it silent."""
        try:
            self._follow_stream(batches)
        except Exception as e:
            self._finish(errors.FencerError("following ring %s failed: %r" % (self.name, e)))
            raise

    def _follow_stream(self, batches):
        """Reads the member's stream, and reopens it through the session
        after UNAVAILABLE with jittered backoff (50 ms doubling to 5 s),
        until it ends: with OK once the member has left, or with another
        error, which ends the ring."""
        retry = _Backoff(0.05, 5.0)
        c = self._client
        while True:
            try:
                for resp in batches:
                    if resp.snapshot:
                        retry.reset()
                        if self._leaving:
                            try:
                                self._send_leave()  # a reopened stream of a member that was leaving
                            except errors.FencerError as e:
                                self._finish(e)
                                return
                    self._apply(resp)
                self._finish(None)
                return
            except grpc.RpcError as e:
                if self.done.is_set():
                    return
                err = errors.from_rpc_error(e)
                if not (isinstance(err, errors.UnavailableError) or e.code() == grpc.StatusCode.CANCELLED
                        or err.reason == errors.WATCH_COMPACTED):
                    self._finish(err)
                    return
            if self.done.wait(retry.next()):
                return
            req = fencer_pb2.JoinRingRequest(ring=self.name, session_id=self.session_id, member=self.member,
                                             drain_seconds=self._drain)
            with self._mu:
                if self.done.is_set():
                    return
                call = c._stub.JoinRing(req, metadata=c._md)
                self._call = call
                batches = _batches(call)

    def _finish(self, err):
        """Ends the ring (once): every shard still in the view is LOST,
        changes() ends (raising err if set), and the stream is cancelled."""
        with self._mu:
            if self.done.is_set():
                return
            self.error = err
            reason = "the member left" if err is None else str(err)
            for sh in list(self._view.values()):
                self._lost(sh, reason)
            self._changes.put(_END)
            self.done.set()
            call = self._call
        with self._client._mu:
            if self._client._rings.get(self.name) is self:
                del self._client._rings[self.name]
        if call is not None:
            call.cancel()

    # -- hand-offs -----------------------------------------------------

    def release(self, *shards):
        """Hands off shards (names or Shards) this member is losing, saying
        that it has stopped acting for them, and returns how many were
        released. A shard the member no longer owns (or a Shard handle of
        an earlier acquisition) is skipped; one it owns but is not losing
        raises NotHeldError (metadata["cause"] "not_losing"), as the server
        answers."""
        names = []
        with self._mu:
            for s in shards:
                name = s.name if isinstance(s, Shard) else s
                sh = self._view.get(name)
                if sh is not None and (not isinstance(s, Shard) or s is sh):
                    names.append(name)
        return self._release_names(names) if names else 0

    def _release_names(self, names):
        n = 0
        for i in range(0, len(names), _RELEASE_BATCH):
            req = fencer_pb2.ReleaseShardsRequest(ring=self.name, session_id=self.session_id,
                                                  shards=names[i:i + _RELEASE_BATCH])
            n += self._client._call(self._client._stub.ReleaseShards, req).released
        return n

    def _send_leave(self):
        self._client._call(self._client._stub.LeaveRing,
                           fencer_pb2.LeaveRingRequest(ring=self.name, session_id=self.session_id))

    def leave(self, timeout=None):
        """Leaves the ring: marks the member leaving (LeaveRing), so that the
        other members stop counting it and it hands off every shard, and
        waits until the server has handed them off and ended the stream, at
        most timeout seconds (None: the drain time plus the client's
        timeout; the server starts at most 100 hand-offs a second, so a
        member of thousands of shards wants more). Leaving says the member has stopped acting for every
        shard, so each shard reported LOSING from then on is released at
        once, without waiting for its drain. Returns whether the member
        left within the bound; either way the ring is ended: every shard
        still in the view is LOST, and what the server still holds is handed
        off by the server (the member is marked leaving) or ends with the
        session."""
        if self.done.is_set():
            return self.error is None
        with self._mu:
            self._leaving = True
            losing = [sh.name for sh in self._view.values() if sh.losing.is_set()]
        bound = (self._drain or 5) + self._client.timeout if timeout is None else timeout
        try:
            self._send_leave()
            if losing:
                self._release_names(losing)
        except errors.FencerError as e:
            self._finish(e)
            return False
        left = self.done.wait(bound)
        if not left:
            self._finish(errors.UnavailableError("the member did not finish leaving ring %s within %gs" % (self.name, bound)))
        return left and self.error is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()
        return False


def _batches(call):
    """Yields the batches of a JoinRing stream: each message, or the
    messages of a batch the server split (more set on all but its last),
    joined into the first. A stream that ends inside a batch drops it."""
    batch = None
    for resp in call:
        if batch is None:
            batch = resp
        else:
            batch.changes.extend(resp.changes)
            batch.revision = resp.revision
        if not resp.more:
            batch.more = False
            yield batch
            batch = None
