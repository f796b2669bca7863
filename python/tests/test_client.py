"""Tests of fencer's Python client against a real fencer serve at
$FENCER_SERVER (cmd/fencer's TestPythonClient starts one and runs these
with /usr/bin/python3)."""

import os
import socket
import threading
import time
import unittest
import uuid
from unittest import mock

import grpc

import fencer
import fencer.client
from fencer import txn
from fencer.v1 import fencer_pb2, fencer_pb2_grpc


def name(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.server = os.environ["FENCER_SERVER"]
        # 4 s: short enough for the tests that wait past it, long enough
        # that a renewal every 4/3 s survives make test's load, which runs
        # these beside every other package's tests (with 2 s, a session
        # once ended with no keepalive succeeding within its TTL).
        self.a = fencer.Client(self.server, ttl=4)
        self.b = fencer.Client(self.server, ttl=4)
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_acquire_put_get_release(self):
        lease_name = name("orders")
        key = lease_name + "/total"
        with self.a.acquire(lease_name) as lease:
            self.assertTrue(lease.token.startswith("v1:1:"), lease.token)
            self.assertGreater(lease.put(key, b"100"), 0)
            self.assertEqual(self.a.get(key), b"100")
            self.assertTrue(lease.delete(key))
            self.assertIsNone(self.a.get(key))
        self.assertTrue(lease.lost.is_set())
        self.assertEqual(lease.lost_reason, "released")
        # Released: another client acquires at once, with a greater token.
        with self.b.acquire(lease_name, wait=False) as again:
            self.assertTrue(again.token.startswith("v1:2:"), again.token)

    def test_keepalive_holds_the_lease_past_its_ttl(self):
        with self.a.acquire(name("long")) as lease:
            time.sleep(3 * self.a.ttl)
            self.assertFalse(lease.lost.is_set(), lease.lost_reason)
            lease.check()
            lease.put(lease.name + "/k", b"still mine")

    def test_keepalive_renews_over_one_stream(self):
        calls = _CountingInterceptor()
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, calls))
        with self.a.acquire(name("one-stream")) as lease:
            time.sleep(3 * self.a.ttl)  # about 9 renewals at TTL/3
            self.assertFalse(lease.lost.is_set(), lease.lost_reason)
        self.assertEqual(calls.count("KeepAlive"), 1, calls.calls)

    def test_keepalive_reopens_a_broken_stream(self):
        calls = _CountingInterceptor(break_first="KeepAlive", after=1.0)
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, calls))
        with self.a.acquire(name("reopen")) as lease:
            time.sleep(3 * self.a.ttl)
            self.assertFalse(lease.lost.is_set(), lease.lost_reason)
            lease.check()
        self.assertEqual(calls.count("KeepAlive"), 2, calls.calls)

    def test_renewal_after_an_outage_checks_the_leases(self):
        # Renewals and the watch fail together, as when the server
        # restarts; the token is released meanwhile by another caller.
        # When renewals come back but the watch stays away, the lease must
        # end then (its token checked), not when the watch returns or the
        # TTL runs out.
        cut = _CuttingInterceptor()
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, cut))
        lease = self.a.acquire(name("unheard"))
        cut.cut({"KeepAlive", "WatchLease"})
        self.assertTrue(self.b.release(lease.token))
        deadline = time.monotonic() + 10
        while cut.count("KeepAlive") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertGreaterEqual(cut.count("KeepAlive"), 2, "no renewal was tried in the outage")
        self.assertFalse(lease.lost.is_set(), "the lease cannot have heard of its release yet: %s" % lease.lost_reason)
        cut.cut({"WatchLease"})  # renewals come back; the watch stays away
        self.assertTrue(lease.lost.wait(self.a.ttl / 2.0), "the lease outlived its released token after renewals came back")
        self.assertEqual(lease.lost_reason, "stale")

    def test_stale_write_after_the_lease_is_taken(self):
        lease_name = name("stale")
        key = lease_name + "/total"
        old = self.a.acquire(lease_name)
        old.put(key, b"100")
        # The lease is taken from the holder (an operator releases its
        # token), and another client acquires it and writes.
        self.assertTrue(self.b.release(old.token))
        self.assertTrue(old.lost.wait(5), "the watch did not report the loss")
        new = self.b.acquire(lease_name, wait=False)
        new.put(key, b"250")
        # The old holder's late write is refused, and changes nothing.
        with self.assertRaises(fencer.StaleError) as cm:
            old.put(key, b"999")
        self.assertEqual(cm.exception.reason, "STALE_TOKEN")
        self.assertEqual(cm.exception.token, old.token)
        self.assertEqual(cm.exception.newer_token, new.token)
        # The message is for the user: both tokens, none of the server's
        # internals (no Go package prefix such as "etcdstore: put").
        self.assertEqual(str(cm.exception), "stale token: %s is superseded by %s; nothing was written" % (old.token, new.token))
        with self.assertRaises(fencer.StaleError) as cm:
            old.check()
        self.assertEqual(str(cm.exception), "stale token: %s is superseded by %s; nothing was written" % (old.token, new.token))
        with self.assertRaises(fencer.StaleError):
            old.delete(key)
        with self.assertRaises(fencer.StaleError):
            old.txn(success=[txn.put(key, b"999")])
        self.assertEqual(self.b.get(key), b"250")
        new.release()

    def test_held_error(self):
        lease_name = name("held")
        with self.a.acquire(lease_name):
            with self.assertRaises(fencer.HeldError) as cm:
                self.b.acquire(lease_name, wait=False)
            self.assertEqual(cm.exception.lease, lease_name)
            self.assertTrue(cm.exception.holder)
            self.assertEqual(str(cm.exception), 'lease "%s" is held by %s' % (lease_name, cm.exception.holder))

    def test_lock_delay(self):
        lease_name = name("delay")
        # The holder's own release is clean: the lease is free at once.
        self.a.acquire(lease_name, lock_delay=2).release()
        lease = self.b.acquire(lease_name, wait=False, lock_delay=2)
        # Released by token from another client: the delay applies.
        self.assertTrue(self.a.release(lease.token))
        with self.assertRaises(fencer.LockDelayError) as cm:
            self.a.acquire(lease_name, wait=False)
        self.assertNotIsInstance(cm.exception, fencer.HeldError)
        self.assertEqual(cm.exception.lease, lease_name)
        start = time.monotonic()
        again = self.a.acquire(lease_name, timeout=15)  # waits the delay out
        self.assertGreaterEqual(time.monotonic() - start, 0.5)
        again.release()

    def test_acquire_gives_up_after_timeout_as_held(self):
        lease_name = name("wait-timeout")
        with self.a.acquire(lease_name) as held:
            start = time.monotonic()
            with self.assertRaises(fencer.WaitTimeoutError) as cm:
                self.b.acquire(lease_name, timeout=1)
            waited = time.monotonic() - start
            self.assertIsInstance(cm.exception, fencer.HeldError)
            self.assertNotIsInstance(cm.exception, fencer.UnavailableError)
            self.assertEqual(cm.exception.lease, lease_name)
            self.assertTrue(cm.exception.holder)
            self.assertEqual(str(cm.exception), 'gave up waiting for lease "%s" after 1s, held by %s' % (lease_name, cm.exception.holder))
            self.assertNotIn("cannot reach", str(cm.exception))
            self.assertGreaterEqual(waited, 0.9)  # it waited, rather than failing at once
            self.assertFalse(held.lost.is_set(), held.lost_reason)
            # Without waiting, and with no time left to wait, it fails at once.
            with self.assertRaises(fencer.HeldError):
                self.b.acquire(lease_name, wait=False)
            with self.assertRaises(fencer.WaitTimeoutError):
                self.b.acquire(lease_name, timeout=0)
        with self.assertRaises(ValueError):
            self.b.acquire(lease_name, timeout=-1)

    def test_acquire_waits_past_the_call_timeout(self):
        # The per-call timeout (1 s) bounds reaching the server, not the wait
        # for a held lease: acquire() with no timeout waits until the holder
        # releases, 3 s later, longer than the waiter's TTL (2 s) too, which
        # the session must survive.
        lease_name = name("wait-forever")
        held = self.a.acquire(lease_name)
        waiter = fencer.Client(self.server, ttl=2, timeout=1)
        self.addCleanup(waiter.close)
        got = {}

        def acquire():
            try:
                got["lease"] = waiter.acquire(lease_name)
            except Exception as e:  # reported below
                got["error"] = e

        t = threading.Thread(target=acquire, daemon=True)
        start = time.monotonic()
        t.start()
        time.sleep(3)
        self.assertTrue(t.is_alive(), got)  # still waiting, past the call timeout
        held.release()
        t.join(20)
        self.assertFalse(t.is_alive(), "acquire did not return after the release")
        self.assertNotIn("error", got)
        lease = got["lease"]
        self.assertGreaterEqual(time.monotonic() - start, 3)
        self.assertTrue(lease.token.startswith("v1:2:"), lease.token)
        time.sleep(2 * waiter.ttl)  # the new session is renewed past its TTL
        self.assertFalse(lease.lost.is_set(), lease.lost_reason)
        lease.put(lease_name + "/k", b"mine")
        lease.release()

    def test_waiting_acquire_learns_of_a_dead_connection(self):
        # The connection stops passing anything, as in a partition, while
        # acquire waits for a held lease: keepalive pings find it dead, and
        # acquire raises UnavailableError long before its wait would end.
        lease_name = name("partition")
        proxy = _FreezingProxy(self.server)
        self.addCleanup(proxy.close)
        with mock.patch.object(fencer.client, "_KEEPALIVE", (6, 2)):
            c = fencer.Client(proxy.address)
        self.addCleanup(c.close)
        with self.a.acquire(lease_name):
            threading.Timer(1, proxy.frozen.set).start()  # once the waiting call is made
            start = time.monotonic()
            with self.assertRaises(fencer.UnavailableError):
                c.acquire(lease_name, timeout=30)
            self.assertLess(time.monotonic() - start, 25)

    def test_txn(self):
        with self.a.acquire(name("txn")) as lease:
            key = lease.name + "/state"
            lease.put(key, "open")
            r = lease.txn(compares=[txn.value(key, "=", "open")],
                          success=[txn.put(key, "closed"), txn.get(key)],
                          failure=[txn.get(key)])
            self.assertTrue(r.succeeded)
            self.assertGreater(r.results[0], 0)
            self.assertEqual(r.results[1], b"closed")
            r = lease.txn(compares=[txn.value(key, "=", "open")], success=[txn.delete(key)], failure=[txn.get(key)])
            self.assertFalse(r.succeeded)
            self.assertEqual(r.results, [b"closed"])

    def test_foreign_lease(self):
        with self.a.acquire(name("one")) as one, self.a.acquire(name("two")) as two:
            key = one.name + "/k"
            one.put(key, b"1")
            with self.assertRaises(fencer.ForeignLeaseError) as cm:
                two.put(key, b"2")
            self.assertEqual(str(cm.exception), "foreign lease: the key or resource belongs to lease \"%s\", not to the token's lease \"%s\"; nothing was written (set take_over to take it over)" % (one.name, two.name))
            two.put(key, b"2", take_over=True)
            self.assertEqual(self.a.get(key), b"2")

    def test_invalid_token(self):
        with self.assertRaises(fencer.InvalidTokenError) as cm:
            self.a.put("v9:nope", "k", b"v")
        self.assertEqual(str(cm.exception), 'malformed token: version "v9": want "v1" (a token looks like v1:EPOCH:REVISION:LEASE)')
        with self.a.acquire(name("invalid")) as lease:
            with self.assertRaises(fencer.InvalidArgumentError) as cm:
                lease.put("", b"v")
            self.assertEqual(str(cm.exception), 'invalid key "": empty')
            self.assertEqual(cm.exception.metadata["field"], "key")

    def test_session_end_marks_leases_lost(self):
        lease = self.a.acquire(name("end"))
        self.a.close()
        self.assertTrue(lease.lost.is_set())
        with self.assertRaises(fencer.StaleError) as cm:
            self.b.check(lease.token)
        self.assertEqual(str(cm.exception), "stale token: %s is no longer current; nothing was written" % lease.token)
        with self.assertRaises(fencer.SessionNotFoundError) as cm:
            self.b._call(self.b._stub.Acquire, fencer_pb2.AcquireRequest(name=name("end"), session_id=self.a._session_id))
        self.assertEqual(str(cm.exception), "session not found: it has expired or was released")

    def test_server_as_url(self):
        # As the CLI takes it: http:// is plaintext, to the same server.
        with fencer.Client("http://" + self.server) as c:
            self.assertIsNone(c.get(name("url") + "/absent"))
        for bad in ("grpc://" + self.server, "http://", "http://" + self.server + "/x"):
            with self.assertRaises(ValueError) as cm:
                fencer.Client(bad)
            self.assertIn("want host:port", str(cm.exception))
        with self.assertRaises(ValueError):
            fencer.Client("http://" + self.server, root_certificates=True)
        os.environ["FENCER_SERVER"], saved = "http://" + self.server, os.environ["FENCER_SERVER"]
        try:
            with fencer.Client() as c:
                self.assertEqual(c.server, self.server)
        finally:
            os.environ["FENCER_SERVER"] = saved

    def test_unavailable(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with fencer.Client("127.0.0.1:%d" % port, timeout=2) as c:
            with self.assertRaises(fencer.UnavailableError) as cm:
                c.acquire("x", wait=False)
            self.assertIn("fencer serve", str(cm.exception))
            # Waiting, for ever or bounded, does not turn it into a wait.
            for timeout in (None, 30):
                with self.assertRaises(fencer.UnavailableError) as cm:
                    c.acquire("x", timeout=timeout)
                self.assertIn("fencer serve", str(cm.exception))


class _FreezingProxy:
    """A TCP proxy to address that, once frozen is set, passes nothing more
    either way and keeps its connections open, as a partition does."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._socks = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self._listener.accept()
                up = socket.create_connection(self._target)
            except OSError:
                return
            self._socks += [down, up]
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if self.frozen.is_set():
                    self._closed.wait()
                    return
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        src.close()
        dst.close()

    def close(self):
        self._closed.set()
        for s in self._socks:
            s.close()


class _CountingInterceptor(grpc.StreamStreamClientInterceptor, grpc.UnaryUnaryClientInterceptor,
                           grpc.UnaryStreamClientInterceptor):
    """Counts the calls a channel starts, by method. With break_first, it
    cancels the first call of that method after `after` seconds, as a
    dropped connection would end it."""

    def __init__(self, break_first=None, after=0):
        self.calls = []
        self._break, self._after = break_first, after

    def count(self, method):
        return sum(1 for m in self.calls if m.endswith("/" + method))

    def _count(self, continuation, details, request):
        first = self._break is not None and self.count(self._break) == 0 and details.method.endswith("/" + self._break)
        self.calls.append(details.method)
        call = continuation(details, request)
        if first:
            threading.Timer(self._after, call.cancel).start()
        return call

    intercept_unary_unary = _count
    intercept_unary_stream = _count
    intercept_stream_stream = _count


class _Unavailable(grpc.RpcError, grpc.Call):
    """The error of a call cut off by _CuttingInterceptor, as a lost
    connection ends it."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "cut off"

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


class _CutCall:
    """A streaming call that _CuttingInterceptor can cut: its reader then
    gets UNAVAILABLE."""

    def __init__(self, call):
        self._call, self._cut = call, call is None

    def __iter__(self):
        return self

    def __next__(self):
        if self._cut:
            raise _Unavailable()
        try:
            return next(self._call)
        except grpc.RpcError:
            if self._cut:
                raise _Unavailable() from None
            raise

    def cut(self):
        self._cut = True
        if self._call is not None:
            self._call.cancel()

    def cancel(self):
        if self._call is not None:
            self._call.cancel()

    def __getattr__(self, attr):
        return getattr(self._call, attr)


class _CuttingInterceptor(grpc.StreamStreamClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Lets a test cut off the streaming calls of some methods, open or yet
    to come, as a partition from the server would, while the channel's
    other calls go through."""

    def __init__(self):
        self._mu = threading.Lock()
        self._methods = set()
        self._open = []  # (method, _CutCall)
        self.calls = []

    def count(self, method):
        with self._mu:
            return sum(1 for m in self.calls if m.endswith("/" + method))

    def cut(self, methods):
        """Cuts the open calls of methods, and every later one until the
        next cut, which replaces the set."""
        with self._mu:
            self._methods = set(methods)
            for m, c in self._open:
                if m.rsplit("/", 1)[-1] in self._methods:
                    c.cut()

    def _intercept(self, continuation, details, request):
        with self._mu:
            self.calls.append(details.method)
            if details.method.rsplit("/", 1)[-1] in self._methods:
                return _CutCall(None)
        c = _CutCall(continuation(details, request))
        with self._mu:
            self._open.append((details.method, c))
            if details.method.rsplit("/", 1)[-1] in self._methods:
                c.cut()  # cut while it started
        return c

    intercept_unary_stream = _intercept
    intercept_stream_stream = _intercept


if __name__ == "__main__":
    unittest.main()
