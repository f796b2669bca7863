"""fencer's Python client: leases held by a session with a background
keepalive thread, and guarded writes with their tokens.

    client = fencer.Client("127.0.0.1:7890")
    with client.acquire("orders") as lease:
        lease.put("orders/total", b"100")   # fenced: fails once the lease is superseded
        if lease.lost.is_set():
            ...                              # the server reported the lease gone

A Client holds one session, opened by its first acquisition (or ring
join): an etcd lease that a keepalive thread renews every TTL/3, and that a
watch thread follows so that a lease's `lost` event is set promptly when
its holder key is deleted or replaced. `lost` is advisory, like the Go client's Done: every
write is fenced by etcd, not by the event. The session fails closed: when
no renewal has succeeded within the TTL (measured on the monotonic clock),
every lease is marked lost.

Errors are the exceptions of fencer.errors (StaleError, HeldError, ...).
"""

import math
import os
import queue
import random
import threading
import time

import grpc

from fencer import errors
from fencer.v1 import fencer_pb2, fencer_pb2_grpc

DEFAULT_SERVER = "127.0.0.1:7890"

# The channel's keepalive: while a call or stream is open (acquire's wait,
# the session's streams), it pings every _KEEPALIVE[0] seconds and drops
# the connection when a ping has no answer within _KEEPALIVE[1] seconds, so
# that a connection that passes nothing (a partition, a frozen server)
# fails those calls with UnavailableError instead of leaving them waiting.
# fencer serve refuses pings more often than every 5 s.
_KEEPALIVE = (10, 5)


class _Guarded:
    """The guarded calls of one token, shared by Lease and ring.Shard: each
    carries token, so etcd refuses it once the token is superseded."""

    def __init__(self, client, name, token):
        self._client = client
        self.name = name
        self.token = token
        self.lost = threading.Event()
        self.lost_reason = None

    def _lose(self, reason):
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    def put(self, key, value, take_over=False):
        """Writes key with this token; see Client.put."""
        return self._client.put(self.token, key, value, take_over=take_over)

    def delete(self, key, take_over=False):
        """Deletes key with this token; see Client.delete."""
        return self._client.delete(self.token, key, take_over=take_over)

    def txn(self, compares=(), success=(), failure=(), take_over=False):
        """Runs a transaction with this token; see Client.txn."""
        return self._client.txn(self.token, compares, success, failure, take_over=take_over)

    def check(self):
        """Raises StaleError unless the token is still current."""
        self._client.check(self.token)


class Lease(_Guarded):
    """One acquisition, held through the Client's session. token is fixed
    for its lifetime; lost is set when the acquisition ends (released,
    reported lost, or its session ended) and lost_reason says why."""

    def release(self):
        """Releases the lease if its token is still current (a late release
        never ends a newer holder's lease), and marks it lost."""
        self._lose("released")
        self._client._forget(self)
        self._client._release_held(self.token)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class TxnResult:
    """The outcome of Client.txn: succeeded says which branch ran; results
    has one entry per operation of that branch: an int revision for a put,
    a bool for a delete, the value (or None) for a get."""

    def __init__(self, succeeded, results):
        self.succeeded = succeeded
        self.results = results


def _parse_server(server, root_certificates):
    """Returns the host:port of server and the TLS roots to use. As the CLI
    (and etcdctl's --endpoints) does, server is host:port, or a URL whose
    scheme says only whether to use TLS: http://host:port is plaintext,
    https://host:port TLS (with the system's roots unless
    root_certificates). Anything else with a scheme raises ValueError."""
    if "://" not in server:
        return server, root_certificates
    scheme, _, rest = server.partition("://")
    if not rest or "/" in rest or scheme not in ("http", "https"):
        raise ValueError("server %r: want host:port, http://host:port or https://host:port" % server)
    if scheme == "http":
        if root_certificates is not None:
            raise ValueError("server %r is plaintext (http://) but root_certificates asks for TLS" % server)
        return rest, None
    return rest, True if root_certificates is None else root_certificates


class Client:
    """A connection to a fencer server and the session its leases are held
    by. server defaults to $FENCER_SERVER, auth_token (a bearer token) to
    $FENCER_AUTH_TOKEN. With root_certificates (PEM bytes, or True for the
    system's roots) the channel uses TLS; a bearer token is sent over
    plaintext only when allow_insecure is set or the server is on loopback.
    ttl is the session's TTL in whole seconds; timeout bounds each call
    to the server, in seconds, but not acquire's wait for a lease another
    holder has (acquire's own timeout bounds that). Methods are safe to
    call from several threads."""

    def __init__(self, server=None, auth_token=None, root_certificates=None,
                 ttl=10, timeout=10.0, allow_insecure=False):
        self.server, root_certificates = _parse_server(server or os.environ.get("FENCER_SERVER") or DEFAULT_SERVER,
                                                       root_certificates)
        token = auth_token if auth_token is not None else os.environ.get("FENCER_AUTH_TOKEN")
        every, within = _KEEPALIVE
        options = [("grpc.keepalive_time_ms", int(every * 1000)), ("grpc.keepalive_timeout_ms", int(within * 1000)),
                   ("grpc.http2.max_pings_without_data", 0)]
        if root_certificates is not None:
            roots = None if root_certificates is True else root_certificates
            self._channel = grpc.secure_channel(self.server, grpc.ssl_channel_credentials(roots), options=options)
        else:
            host = self.server.rsplit(":", 1)[0].strip("[]")
            if token and not allow_insecure and host not in ("127.0.0.1", "::1", "localhost"):
                raise errors.FencerError("refusing to send the bearer token in plaintext to %s: pass root_certificates or allow_insecure=True" % self.server)
            self._channel = grpc.insecure_channel(self.server, options=options)
        self._stub = fencer_pb2_grpc.FencerServiceStub(self._channel)
        self._md = (("authorization", "Bearer " + token),) if token else ()
        if int(ttl) != ttl or not 1 <= ttl <= 3600:
            raise ValueError("ttl must be a whole number of seconds from 1 to 3600")
        self.ttl = int(ttl)
        self.timeout = timeout
        self._mu = threading.Lock()
        self._open = threading.Lock()  # serializes the acquisition (or join) that opens the session
        self._session_id = 0
        self._session_secret = b""  # proves a clean release; from the Acquire that opened the session
        self._held = {}  # name -> Lease
        self._closed = threading.Event()
        self._session_end = None
        self._threads = []
        self._watch_call = None
        self._rings = {}  # name -> ring.Ring, while it follows its stream

    # -- calls ---------------------------------------------------------

    def _call(self, method, request):
        try:
            return method(request, metadata=self._md, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def put(self, token, key, value, take_over=False):
        """Writes key if and only if token is current and key belongs to its
        lease or none; returns the revision. Raises StaleError or
        ForeignLeaseError, having written nothing."""
        return self._call(self._stub.Put, fencer_pb2.PutRequest(token=token, key=key, value=_bytes(value), take_over=take_over)).revision

    def get(self, key):
        """Returns key's value, or None if it does not exist. Not guarded."""
        resp = self._call(self._stub.Get, fencer_pb2.GetRequest(key=key))
        return resp.value if resp.found else None

    def delete(self, token, key, take_over=False):
        """Deletes key, guarded like put; returns whether it existed."""
        return self._call(self._stub.Delete, fencer_pb2.DeleteRequest(token=token, key=key, take_over=take_over)).deleted

    def txn(self, token, compares=(), success=(), failure=(), take_over=False):
        """Runs compares, then success or failure, in one etcd transaction
        that commits only if token is current (StaleError otherwise, and
        neither branch runs). Build the parts with fencer.txn."""
        resp = self._call(self._stub.Txn, fencer_pb2.TxnRequest(
            token=token, compares=list(compares), success=list(success), failure=list(failure), take_over=take_over))
        results = []
        for r in resp.results:
            kind = r.WhichOneof("result")
            if kind == "put":
                results.append(r.put.revision)
            elif kind == "delete":
                results.append(r.delete.deleted)
            else:
                results.append(r.get.value if r.get.found else None)
        return TxnResult(resp.succeeded, results)

    def check(self, token):
        """Raises StaleError unless token is its lease's current token."""
        self._call(self._stub.Check, fencer_pb2.CheckRequest(token=token))

    def release(self, token):
        """Releases the acquisition of token if it is still current;
        returns whether something was released."""
        return self._call(self._stub.Release, fencer_pb2.ReleaseRequest(token=token)).released

    def _release_held(self, token):
        """Releases token as its holder, from the session that holds it: a
        clean release, which skips the lease's lock-delay."""
        if not self._session_id:
            return self.release(token)
        req = fencer_pb2.ReleaseRequest(token=token, holder_session_id=self._session_id,
                                        holder_session_secret=self._session_secret)
        return self._call(self._stub.Release, req).released

    # -- rings ---------------------------------------------------------

    def create_ring(self, name, shards=None, shard_count=None):
        """Creates ring name with either the shards named in shards or
        shard_count shards named "0" to "<shard_count-1>", and returns
        whether it was created: False when it existed with the same
        shards, which changes nothing. A ring is immutable: one with
        other shards raises RingConflictError; an invalid name, shard
        list or count raises InvalidArgumentError; neither writes
        anything."""
        req = fencer_pb2.CreateRingRequest(ring=name)
        if shards is not None:
            req.shards.extend(shards)
        if shard_count is not None:
            req.shard_count = shard_count
        return self._call(self._stub.CreateRing, req).created

    def ring_status(self, name):
        """Returns the fencer.ring.RingStatus of ring name, read at one etcd
        revision; raises RingNotFoundError if it was never created."""
        from fencer import ring

        return ring.RingStatus._of(self._call(self._stub.RingStatus, fencer_pb2.RingStatusRequest(ring=name)))

    def join(self, name, member=None, drain=5):
        """Joins ring name as member (None: the session's holder identity)
        through the client's session, opening one as acquire does if the
        client has none, and returns the fencer.ring.Ring, a context
        manager that leaves the ring. drain is how many seconds (0 to 600;
        0 means 5; never less than the session's TTL plus one) a shard
        reported losing waits for Shard.release before it is released
        anyway. The member's first snapshot has been read
        when join returns; it raises RingNotFoundError for a ring never
        created, RingConflictError for a member name another session holds
        in the ring, InvalidArgumentError for an invalid name, and
        UnavailableError if the server does not answer within the client's
        timeout. A client joins a ring once at a time (ValueError)."""
        from fencer import ring

        if int(drain) != drain or not 0 <= drain <= 600:
            raise ValueError("drain must be a whole number of seconds from 0 to 600")
        if self._closed.is_set():
            raise errors.SessionNotFoundError("the client is closed")
        if self._session_end is not None:
            raise self._session_end
        with self._mu:
            if name in self._rings:
                raise ValueError("this client is already a member of ring %r" % name)
        if self._session_id:
            return ring.Ring._join(self, name, member or "", int(drain), self._session_id)
        with self._open:
            return ring.Ring._join(self, name, member or "", int(drain), self._session_id)

    # -- leases --------------------------------------------------------

    def acquire(self, name, wait=True, timeout=None, lock_delay=0):
        """Acquires lease name through the session and returns its Lease (a
        context manager that releases it). While another holder has it,
        acquire waits as python-etcd3's Lock.acquire does: with
        timeout=None until the lease is free, else up to timeout seconds
        (0 or more), then raises WaitTimeoutError, a HeldError. With
        wait=False it raises HeldError at once. Waiters are not queued.

        lock_delay (seconds, 0 to 3600, rounded up to whole seconds) is the
        acquisition's lock-delay: if it ends other than by Lease.release
        (the session expired, the holder key was deleted, another caller
        released the token), the server refuses the lease to everyone until
        that long has passed on etcd's clock. A lease in such a delay is
        waited for like a held one; with wait=False acquire raises
        LockDelayError.

        The first attempt does not wait and is bounded by the client's
        per-call timeout, so an unreachable server raises UnavailableError
        whatever the wait; only once the server has answered that the lease
        is held does one waiting call follow, bounded by timeout alone (as
        the Go client and `fencer acquire --wait-timeout` do). One call, not
        a loop of short ones: a call that ends at its deadline can miss an
        acquisition the server made at that moment, so the wait has one
        deadline, not one per call. A waiting call that fails for another
        reason raises that error: UnavailableError when the server stops,
        or when the connection passes nothing for a keepalive period
        (10 s, then 5 s for the ping's answer)."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be None (wait for ever) or 0 or more seconds")
        if not 0 <= lock_delay <= 3600:
            raise ValueError("lock_delay must be 0 to 3600 seconds")
        if self._closed.is_set():
            raise errors.SessionNotFoundError("the client is closed")
        if self._session_end is not None:
            raise self._session_end
        if self._session_id:
            return self._acquire(name, wait, timeout, self._session_id, lock_delay)
        with self._open:
            return self._acquire(name, wait, timeout, self._session_id, lock_delay)

    def _acquire(self, name, wait, timeout, sid, lock_delay=0):
        start = sent = time.monotonic()
        req = fencer_pb2.AcquireRequest(name=name, session_id=sid, lock_delay_seconds=int(math.ceil(lock_delay)))
        if sid == 0:
            req.ttl_seconds = self.ttl
        try:
            resp = self._call(self._stub.Acquire, req)
        except (errors.HeldError, errors.LockDelayError) as held:
            if not wait:
                raise
            req.wait = True
            sent = time.monotonic()
            left = None if timeout is None else start + timeout - sent
            resp = self._wait_acquire(req, left, held, timeout)
        lease = Lease(self, name, resp.token)
        with self._mu:
            self._held[name] = lease
        if sid == 0:
            self._opened(resp.session_id, resp.session_secret, resp.ttl_seconds, sent, _revision(resp.token))
        return lease

    def _opened(self, sid, secret, ttl, sent, from_rev):
        """Adopts the session a call sent at sent (monotonic) opened, and
        starts its keepalive and watch threads. The server renewed the new
        session every TTL/3 while the call waited, so it expires no sooner
        than either bound (as in the Go client)."""
        deadline = max(sent + ttl, time.monotonic() + ttl / 2.0)
        self._session_id = sid
        self._session_secret = secret
        self._start(sid, deadline, from_rev)

    def _wait_acquire(self, req, left, held, timeout):
        """Makes the waiting Acquire call, whose only deadline is left
        seconds (None: none), and raises WaitTimeoutError when it passes."""
        if left is not None and left <= 0:
            raise errors.WaitTimeoutError.after(held, timeout)
        try:
            return self._stub.Acquire(req, metadata=self._md, timeout=left)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise errors.WaitTimeoutError.after(held, timeout) from None
            raise errors.from_rpc_error(e) from None

    def _forget(self, lease):
        with self._mu:
            if self._held.get(lease.name) is lease:
                del self._held[lease.name]

    def _start(self, sid, deadline, from_rev):
        for target, args in ((self._keepalive, (sid, deadline)), (self._watch, (sid, from_rev))):
            t = threading.Thread(target=target, args=args, daemon=True, name="fencer-" + target.__name__.strip("_"))
            t.start()
            self._threads.append(t)

    def _end(self, reason):
        """Ends the session: every lease and every ring's shard is lost
        with reason."""
        with self._mu:
            if self._session_end is None:
                self._session_end = errors.SessionNotFoundError(reason)
            held, self._held = self._held, {}
            rings = list(self._rings.values())
        for lease in held.values():
            lease._lose(reason)
        for r in rings:
            r._finish(errors.SessionNotFoundError(reason))
        call = self._watch_call
        if call is not None:
            call.cancel()

    def _keepalive(self, sid, deadline):
        """Renews the session every TTL/3 over one KeepAlive stream, which it
        reopens after a failure, retrying with jittered exponential backoff
        (200 ms doubling to TTL/10, as the Go client does). It ends the
        session when the local deadline (the send time of the last
        successful renewal plus the TTL granted) passes, or the server
        reports the session gone."""
        interval = self.ttl / 3.0
        retry = _Backoff(0.2, max(self.ttl / 10.0, 0.2))
        delay = interval
        stream, failed = None, False
        try:
            while not self._closed.wait(min(delay, max(deadline - time.monotonic(), 0))):
                sent = time.monotonic()
                if sent >= deadline:
                    self._end("no keepalive succeeded within the %ds TTL" % self.ttl)
                    return
                if stream is None:
                    stream = _KeepAliveStream(self._stub, self._md)
                try:
                    ttl = stream.renew(sid, deadline - sent)
                except (grpc.RpcError, StopIteration) as e:
                    if isinstance(e, grpc.RpcError) and isinstance(errors.from_rpc_error(e), errors.SessionNotFoundError):
                        self._end("the session expired")
                        return
                    stream.close()
                    stream, delay, failed = None, min(retry.next(), interval), True
                    continue
                retry.reset()
                if failed:
                    # The watch may have been down as long as the renewals
                    # were, and may stay down (a restarted server's watch
                    # reconnects later): check every held lease before this
                    # renewal extends the deadline, so that one ended
                    # meanwhile ends now. Without an answer the deadline
                    # stays.
                    if not self._check_all(deadline - time.monotonic()):
                        delay = min(retry.next(), interval)
                        continue
                    failed = False
                deadline = sent + ttl
                delay = interval
        finally:
            if stream is not None:
                stream.close()

    def _watch(self, sid, from_rev):
        """Follows the session's WatchLease stream and marks each lease
        reported lost; reconnects from the last revision seen."""
        retry = _Backoff(0.05, 5.0)
        while not self._closed.is_set() and self._session_end is None:
            call = self._stub.WatchLease(fencer_pb2.WatchLeaseRequest(session_id=sid, start_revision=from_rev), metadata=self._md)
            self._watch_call = call
            if self._closed.is_set() or self._session_end is not None:
                call.cancel()
                return
            try:
                for ev in call:
                    if ev.type == fencer_pb2.WatchLeaseResponse.TYPE_SYNCED:
                        from_rev = ev.revision
                        retry.reset()
                    elif ev.type == fencer_pb2.WatchLeaseResponse.TYPE_PROGRESS:
                        from_rev = ev.revision + 1
                    elif ev.type == fencer_pb2.WatchLeaseResponse.TYPE_LOST:
                        from_rev = ev.revision
                        self._lost(ev.token, ev.reason)
            except grpc.RpcError as e:
                if self._closed.is_set() or e.code() == grpc.StatusCode.CANCELLED:
                    return
                err = errors.from_rpc_error(e)
                if isinstance(err, errors.SessionNotFoundError):
                    self._end("the session expired")
                    return
                if err.reason == errors.WATCH_COMPACTED:
                    from_rev = 0
                    self._check_all()
            self._closed.wait(retry.next())

    def _lost(self, token, reason):
        with self._mu:
            for name, lease in list(self._held.items()):
                if lease.token == token:
                    del self._held[name]
                    lease._lose(reason)

    def _check_all(self, within=None):
        """Marks lost every held lease whose token is no longer current, each
        check bounded by within seconds (the client's timeout if None).
        Returns whether every check had an answer."""
        with self._mu:
            leases = list(self._held.values())
        answered = True
        for lease in leases:
            try:
                self._stub.Check(fencer_pb2.CheckRequest(token=lease.token), metadata=self._md,
                                 timeout=self.timeout if within is None else max(within, 0.05))
            except grpc.RpcError as e:
                if isinstance(errors.from_rpc_error(e), errors.StaleError):
                    self._lost(lease.token, "stale")
                else:
                    answered = False
        return answered

    def close(self):
        """Releases the session on the server (ending every lease it holds),
        stops the background threads and closes the channel."""
        if self._closed.is_set():
            return
        self._closed.set()
        sid = self._session_id
        self._end("the client was closed")
        for t in self._threads:
            t.join(timeout=self.timeout)
        if sid:
            try:
                self._call(self._stub.Release, fencer_pb2.ReleaseRequest(session_id=sid))
            except errors.FencerError:
                pass  # the session expires with its TTL
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _KeepAliveStream:
    """One KeepAlive stream, over which each renewal is a request and its
    answer."""

    def __init__(self, stub, md):
        self._requests = queue.Queue()
        self._call = stub.KeepAlive(iter(self._requests.get, None), metadata=md)

    def renew(self, sid, timeout):
        """Sends one renewal and returns the TTL granted, in seconds. Raises
        grpc.RpcError if the stream fails or no answer comes within
        timeout seconds (the stream is then cancelled), StopIteration if
        the server ended it."""
        self._requests.put(fencer_pb2.KeepAliveRequest(session_id=sid))
        timer = threading.Timer(max(timeout, 0.05), self._call.cancel)
        timer.daemon = True
        timer.start()
        try:
            return next(self._call).ttl_seconds
        finally:
            timer.cancel()

    def close(self):
        self._requests.put(None)
        self._call.cancel()


class _Backoff:
    """Exponential backoff from initial to cap seconds, each wait drawn from
    +-50% of its nominal value, so that clients that failed together do not
    retry together."""

    def __init__(self, initial, cap):
        self._initial, self._cap = initial, cap
        self.reset()

    def reset(self):
        self._nominal = self._initial

    def next(self):
        wait = self._nominal * random.uniform(0.5, 1.5)
        self._nominal = min(self._nominal * 2, self._cap)
        return wait


def _bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)


def _revision(token):
    """The revision field of a token's text form v1:EPOCH:REVISION:LEASE."""
    parts = token.split(":", 3)
    return int(parts[2]) if len(parts) == 4 else 0
