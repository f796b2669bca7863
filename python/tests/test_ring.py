"""Tests of fencer's Python ring client against a real fencer serve at
$FENCER_SERVER (cmd/fencer's TestPythonClient starts one and runs these
with /usr/bin/python3): shards moving on a join, a killed worker's shards
taken over after its session's TTL with its late writes refused, and bad
input refused with nothing written."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import unittest
import uuid

import grpc

import fencer
from fencer.v1 import fencer_pb2_grpc
from test_client import _CountingInterceptor, _CuttingInterceptor  # the tests run by discover, from this directory

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ring_worker.py")


def name(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


class _Worker:
    """A ring_worker.py process and the JSON lines it prints."""

    def __init__(self, test, ring, member, ttl):
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))  # the fencer package this test imports
        self.proc = subprocess.Popen([sys.executable, WORKER, ring, member, str(ttl)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        test.addCleanup(self.stop)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), json.loads(line)))
        self.lines.put((time.monotonic(), None))

    def until(self, test, done, within):
        """Returns the (time, line) pairs read until done(lines) holds, and
        fails test if it does not within seconds or the worker exits."""
        got, deadline = [], time.monotonic() + within
        while not done([line for _, line in got]):
            left = deadline - time.monotonic()
            try:
                at, line = self.lines.get(timeout=max(left, 0))
            except queue.Empty:
                test.fail("the worker printed %s in %gs: %s" % (got, within, self.stderr()))
            if line is None:
                test.fail("the worker exited (%s) after printing %s: %s" % (self.proc.wait(), got, self.stderr()))
            got.append((at, line))
        return got

    def stderr(self):
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def wrote_all(shards):
    return lambda lines: {l["wrote"] for l in lines if "wrote" in l} >= set(shards)


class RingTest(unittest.TestCase):
    def setUp(self):
        self.server = os.environ["FENCER_SERVER"]
        # 4 s, as in test_client: a renewal every 4/3 s survives make
        # test's load.
        self.a = fencer.Client(self.server, ttl=4)
        self.b = fencer.Client(self.server, ttl=4)
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_bad_input_is_refused_with_nothing_written(self):
        ring = name("unknown")
        with self.assertRaises(fencer.RingNotFoundError) as cm:
            self.a.join(ring, member="m")
        self.assertEqual(cm.exception.reason, "RING_NOT_FOUND")
        self.assertEqual(cm.exception.ring, ring)
        with self.assertRaises(fencer.RingNotFoundError):
            self.a.ring_status(ring)

        ring = name("empty-shard")
        with self.assertRaises(fencer.InvalidArgumentError) as cm:
            self.a.create_ring(ring, shards=["a", ""])
        self.assertEqual(cm.exception.reason, "INVALID_ARGUMENT")
        with self.assertRaises(fencer.RingNotFoundError):
            self.a.ring_status(ring)

    def test_create_ring_is_idempotent_and_immutable(self):
        ring = name("orders")
        self.assertTrue(self.a.create_ring(ring, shard_count=3))
        self.assertFalse(self.b.create_ring(ring, shards=["0", "1", "2"]))
        with self.assertRaises(fencer.RingConflictError) as cm:
            self.a.create_ring(ring, shard_count=4)
        self.assertEqual(cm.exception.ring, ring)
        status = self.a.ring_status(ring)
        self.assertEqual((status.shard_count, status.members, status.unowned), (3, [], 3))

    def test_a_join_uses_the_session_of_the_clients_leases(self):
        lease = self.a.acquire(name("lease"))
        r, tokens = self.join_all(self.a, name("shared"), 2, "m")
        self.assertEqual(r.session_id, self.a._session_id)
        lease.put(lease.name + "/k", b"v")  # one keepalive keeps both
        for t in tokens.values():
            self.a.check(t)

    def test_a_member_name_is_held_by_one_session(self):
        ring = name("names")
        self.a.create_ring(ring, shard_count=2)
        with self.a.join(ring, member="dup"):
            with self.assertRaises(fencer.RingConflictError) as cm:
                self.b.join(ring, member="dup")
            self.assertEqual((cm.exception.ring, cm.exception.member), (ring, "dup"))
            with self.assertRaises(ValueError):
                self.a.join(ring, member="other")  # one membership of a ring per client
        self.assertEqual(self.a.ring_status(ring).members, [])
        with self.b.join(ring, member="dup") as rb:  # free once a has left
            self.assertEqual(rb.member, "dup")

    def join_all(self, client, ring, n, member):
        """Creates ring with n shards, joins it as member through client and
        returns the Ring once it has gained every shard, and their tokens."""
        client.create_ring(ring, shard_count=n)
        r = client.join(ring, member=member)
        self.addCleanup(r.leave)
        tokens = {}
        for c in r.changes(timeout=10):
            self.assertEqual(c.kind, fencer.GAINED)
            tokens[c.shard.name] = c.shard.token
            if len(tokens) == n:
                break
        self.assertEqual(len(tokens), n)
        return r, tokens

    def test_a_member_at_rest_makes_no_call_but_its_keepalive(self):
        calls = _CountingInterceptor()
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, calls))
        r, tokens = self.join_all(self.a, name("rest"), 8, "m")
        time.sleep(2 * self.a.ttl)  # 6 renewals at TTL/3
        # One KeepAlive stream renews the session (and with it every
        # shard); the member's stream and the session's watch stay open.
        self.assertEqual(sorted(m.rsplit("/", 1)[1] for m in calls.calls),
                         ["CreateRing", "JoinRing", "KeepAlive", "WatchLease"])
        self.assertEqual({s: r.owns(s).token for s in r.shards()}, tokens)
        for t in tokens.values():
            self.a.check(t)

    def test_a_broken_stream_is_reopened_with_nothing_changed(self):
        calls = _CountingInterceptor(break_first="JoinRing", after=1.0)
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, calls))
        r, tokens = self.join_all(self.a, name("broken"), 4, "m")
        deadline = time.monotonic() + 10
        while calls.count("JoinRing") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(calls.count("JoinRing"), 2, calls.calls)
        self.assertEqual([(c.kind, c.shard.name) for c in r.changes(timeout=1)], [],
                         "the reopened stream's snapshot was reported as changes")
        self.assertEqual({s: r.owns(s).token for s in r.shards()}, tokens)
        self.assertFalse(r.done.is_set())

    def test_a_partitioned_member_fails_closed(self):
        # a's streams (keepalive, ring, watch) are cut, as by a partition:
        # its session ends on its own clock no later than etcd expires it,
        # so a hears every shard LOST before b can gain one.
        cut = _CuttingInterceptor()
        self.a._stub = fencer_pb2_grpc.FencerServiceStub(grpc.intercept_channel(self.a._channel, cut))
        ring = name("partition")
        ra, tokens = self.join_all(self.a, ring, 4, "a")
        cut.cut({"KeepAlive", "JoinRing", "WatchLease"})
        cut_at = time.monotonic()
        rb = self.b.join(ring, member="b")
        self.addCleanup(rb.leave)
        lost = {}
        with self.assertRaises(fencer.SessionNotFoundError):
            for c in ra.changes(timeout=3 * self.a.ttl):
                self.assertEqual(c.kind, fencer.LOST, c)
                lost[c.shard.name] = time.monotonic()
        self.assertEqual(set(lost), set(tokens))
        gained = {}
        for c in rb.changes(timeout=3 * self.b.ttl):
            self.assertEqual(c.kind, fencer.GAINED, c)
            gained[c.shard.name] = time.monotonic()
            rb.owns(c.shard.name).put("%s/%s" % (ring, c.shard.name), b"b")
            if len(gained) == len(tokens):
                break
        self.assertEqual(set(gained), set(tokens))
        self.assertLess(max(lost.values()), min(gained.values()), "b gained a shard before a heard it lost")
        self.assertLessEqual(max(lost.values()) - cut_at, self.a.ttl + 1)
        for s, t in tokens.items():
            with self.assertRaises(fencer.StaleError):
                self.b.put(t, "%s/%s" % (ring, s), b"a-late")  # a's token, replayed
            self.assertEqual(self.b.get("%s/%s" % (ring, s)), b"b")

    def test_a_join_moves_shards(self):
        ring, shards = name("moves"), [str(i) for i in range(16)]
        self.a.create_ring(ring, shard_count=len(shards))
        ra = self.a.join(ring, member="a", drain=30)
        self.addCleanup(ra.leave)
        tokens = {}
        for c in ra.changes(timeout=10):
            self.assertEqual(c.kind, fencer.GAINED)
            c.shard.put("%s/%s" % (ring, c.shard.name), b"a")
            tokens[c.shard.name] = c.shard.token
            if len(tokens) == len(shards):
                break
        self.assertEqual(sorted(tokens), sorted(shards))
        with self.assertRaises(fencer.NotHeldError) as cm:
            ra.owns("0").release()  # a shard not being handed off stays
        self.assertEqual(cm.exception.metadata.get("cause"), "not_losing")
        self.assertEqual(ra.check_owns("0"), tokens["0"])
        self.assertEqual(ra.owns("0").token, tokens["0"])

        rb = self.b.join(ring, member="b", drain=30)
        self.addCleanup(rb.leave)
        # a is told which shards b is assigned; it stops, hands each off,
        # and b gains them (before a's 30 s drain would release them).
        losing, lost, gained = set(), set(), {}
        start = time.monotonic()
        for c in ra.changes(timeout=10):
            if c.kind == fencer.LOSING:
                self.assertEqual(c.shard.token, tokens[c.shard.name])
                self.assertGreater(c.drain, 20)
                losing.add(c.shard.name)
                self.assertTrue(c.shard.release())
            else:
                self.assertEqual(c.kind, fencer.LOST, c)
                self.assertIn(c.shard.name, losing)
                lost.add(c.shard.name)
            if lost and lost == losing and len(ra.shards()) == len(shards) - len(lost):
                break
        for c in rb.changes(timeout=10):
            self.assertEqual(c.kind, fencer.GAINED)
            gained[c.shard.name] = c.shard
            c.shard.put("%s/%s" % (ring, c.shard.name), b"b")
            if set(gained) == lost:
                break
        took = time.monotonic() - start
        self.assertLess(took, 20, "the hand-off waited for the drain")
        print("\nb gained %d of %d shards %.2fs after joining (a released each when told losing; drain 30s)"
              % (len(gained), len(shards), took), file=sys.stderr)
        self.assertTrue(lost, "b joined and was assigned nothing of 16 shards")
        self.assertEqual(set(gained), lost)
        self.assertEqual(set(ra.shards()) | set(rb.shards()), set(shards))
        self.assertFalse(set(ra.shards()) & set(rb.shards()))
        for s in lost:
            self.assertIsNone(ra.check_owns(s))
            self.assertIsNone(ra.owns(s))
            self.assertEqual(rb.check_owns(s), gained[s].token)
            with self.assertRaises(fencer.StaleError) as cm:
                self.a.put(tokens[s], "%s/%s" % (ring, s), b"a-late")
            self.assertEqual(cm.exception.newer_token, gained[s].token)
            self.assertEqual(self.a.get("%s/%s" % (ring, s)), b"b")
        status = self.a.ring_status(ring)
        self.assertEqual({(m.member, m.owned) for m in status.members},
                         {("a", len(shards) - len(lost)), ("b", len(lost))})
        self.assertEqual(status.unowned, 0)

    def test_a_killed_worker_is_replaced_after_its_ttl(self):
        ring, shards, ttl = name("killed"), [str(i) for i in range(8)], 3
        self.a.create_ring(ring, shard_count=len(shards))
        w1 = _Worker(self, ring, "w1", ttl)
        old = {l["wrote"]: l["token"] for _, l in w1.until(self, wrote_all(shards), 30) if "wrote" in l}
        w1.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        w1.proc.wait()

        w2 = _Worker(self, ring, "w2", ttl)
        lines = w2.until(self, wrote_all(shards), ttl + 30)
        first_gain = min(at for at, l in lines if l.get("kind") == fencer.GAINED)
        # w1's session renewed every ttl/3 s, so it lived at least 2/3 of
        # its TTL past the kill; w2 could take nothing before that.
        self.assertGreaterEqual(first_gain - killed, ttl * 2 / 3.0 - 0.5,
                                "w2 gained a shard while w1's session still lived")
        new = {l["wrote"]: l["token"] for _, l in lines if "wrote" in l}
        print("\nkilled worker's shards all written by its replacement %.2fs after the kill (first gained after %.2fs, TTL %ds)"
              % (lines[-1][0] - killed, first_gain - killed, ttl), file=sys.stderr)
        # A late write with the killed worker's token, replayed from a
        # saved copy by another process, is refused; the value stays w2's.
        for s in shards:
            key = "%s/%s" % (ring, s)
            with self.assertRaises(fencer.StaleError) as cm:
                self.a.put(old[s], key, b"w1-late")
            self.assertEqual(cm.exception.newer_token, new[s])
            self.assertEqual(self.a.get(key), b"w2")
        self.assertEqual([(m.member, m.owned) for m in self.a.ring_status(ring).members], [("w2", len(shards))])

    def test_a_paused_worker_resumed_is_refused(self):
        ring, shards, ttl = name("paused"), [str(i) for i in range(4)], 3
        self.a.create_ring(ring, shard_count=len(shards))
        w1 = _Worker(self, ring, "w1", ttl)
        w1.until(self, wrote_all(shards), 30)
        w1.proc.send_signal(signal.SIGSTOP)  # a GC pause, a frozen VM
        self.addCleanup(w1.proc.send_signal, signal.SIGCONT)
        w2 = _Worker(self, ring, "w2", ttl)
        w2.until(self, wrote_all(shards), ttl + 30)
        # w2 stops writing but keeps its shards (its session lives a TTL
        # more): only w1 can write now, with its old tokens.
        w2.proc.send_signal(signal.SIGKILL)
        w1.proc.send_signal(signal.SIGCONT)
        after = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                at, line = w1.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if line is None:
                break
            after.append(line)
        # It hears what its stream queued while it was stopped (LOSING, for
        # the shards the server assigned to w2 when it joined) and that its
        # session has ended (every shard LOST), or writes first and is
        # refused (stale); it never writes.
        for l in after:
            self.assertTrue("stale" in l or l.get("kind") in (fencer.LOSING, fencer.LOST),
                            "the resumed worker printed %s" % after)
        for s in shards:
            self.assertEqual(self.a.get("%s/%s" % (ring, s)), b"w2")


if __name__ == "__main__":
    unittest.main()
