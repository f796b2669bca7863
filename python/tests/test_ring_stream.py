"""Tests of fencer.ring's following of a member's JoinRing stream against a
scripted in-process server, for what a real server cannot be made to do on
cue: a stream that breaks with UNAVAILABLE and is reopened with a snapshot
that differs from the member's view, and a session that ends."""

import queue
import threading
import unittest
from concurrent import futures

import grpc

import fencer
from fencer import errors
from fencer.v1 import fencer_pb2, fencer_pb2_grpc

K = fencer_pb2.ShardChange


def change(kind, shard, token, drain_ms=0):
    return K(kind=kind, shard=shard, token=token, drain_ms=drain_ms)


class _Script(fencer_pb2_grpc.FencerServiceServicer):
    """Answers each JoinRing call with the next script: a list of
    JoinRingResponses, then an optional (code, reason) to end the stream
    with, or None to hold it open until released. Records requests."""

    def __init__(self, scripts):
        self.scripts = queue.Queue()
        for s in scripts:
            self.scripts.put(s)
        self.joins = []
        self.released = []
        self.left = threading.Event()
        self.release_came = threading.Event()
        self.hold = threading.Event()

    def JoinRing(self, request, context):
        self.joins.append(request)
        item = self.scripts.get(timeout=10)
        if callable(item):
            yield from item(self)
            return
        msgs, end = item
        for m in msgs:
            yield m
        if end is None:
            self.hold.wait(10)
            return
        code, reason = end
        if reason:
            st = errors._Status(code=code.value[0], message=reason.lower())
            info = errors._ErrorInfo(reason=reason, domain=errors.DOMAIN)
            st.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
            context.abort_with_status(_Abort(code, reason.lower(), st.SerializeToString()))
        context.abort(code, "scripted")

    def ReleaseShards(self, request, context):
        self.released.extend(request.shards)
        self.release_came.set()
        return fencer_pb2.ReleaseShardsResponse(released=len(request.shards))

    def LeaveRing(self, request, context):
        self.left.set()
        return fencer_pb2.LeaveRingResponse()


class _Abort(grpc.Status):
    def __init__(self, code, details, status_bin):
        self.code = code
        self.details = details
        self.trailing_metadata = (("grpc-status-details-bin", status_bin),)


class RingStreamTest(unittest.TestCase):
    def serve(self, scripts):
        script = _Script(scripts)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        fencer_pb2_grpc.add_FencerServiceServicer_to_server(script, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.addCleanup(server.stop, 0)
        self.addCleanup(script.hold.set)
        client = fencer.Client("127.0.0.1:%d" % port, ttl=60, timeout=5)
        self.addCleanup(client.close)
        return script, client

    def take(self, ring, n):
        got = []
        for c in ring.changes(timeout=5):
            got.append((c.kind, c.shard.name, c.shard.token))
            if len(got) == n:
                break
        return got

    def test_a_reopened_stream_reports_the_snapshot_difference(self):
        first = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, ttl_seconds=60, revision=5,
                                            changes=[change(K.KIND_GAINED, "a", "v1:1:5:ring:r:a")])
        gained_b = fencer_pb2.JoinRingResponse(changes=[change(K.KIND_GAINED, "b", "v1:1:6:ring:r:b")])
        # Reopened: a is gone, b is held with the same token, c is new.
        again = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, revision=9,
                                            changes=[change(K.KIND_GAINED, "b", "v1:1:6:ring:r:b"),
                                                     change(K.KIND_GAINED, "c", "v1:1:9:ring:r:c")])
        script, client = self.serve([([first, gained_b], (grpc.StatusCode.UNAVAILABLE, None)), ([again], None)])
        ring = client.join("r", member="m")
        self.assertEqual(ring.session_id, 7)
        self.assertEqual(client._session_id, 7)
        self.assertEqual(self.take(ring, 4), [
            ("gained", "a", "v1:1:5:ring:r:a"), ("gained", "b", "v1:1:6:ring:r:b"),
            ("lost", "a", "v1:1:5:ring:r:a"), ("gained", "c", "v1:1:9:ring:r:c")])
        self.assertEqual(ring.shards(), ["b", "c"])
        self.assertIsNone(ring.owns("a"))
        self.assertEqual([(j.session_id, j.member, j.ttl_seconds) for j in script.joins], [(0, "m", 60), (7, "m", 0)])

    def test_a_split_batch_is_applied_whole(self):
        # The server splits a batch over 1 MiB: the reopened stream's
        # snapshot comes in two messages (more on the first), and b, in
        # the second part, must not be reported lost in between.
        first = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, ttl_seconds=60, revision=5,
                                            changes=[change(K.KIND_GAINED, "a", "v1:1:5:ring:r:a"),
                                                     change(K.KIND_GAINED, "b", "v1:1:6:ring:r:b")])
        part1 = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, revision=9, more=True,
                                            changes=[change(K.KIND_GAINED, "a", "v1:1:5:ring:r:a")])
        part2 = fencer_pb2.JoinRingResponse(snapshot=True, revision=9,
                                            changes=[change(K.KIND_GAINED, "b", "v1:1:6:ring:r:b"),
                                                     change(K.KIND_GAINED, "c", "v1:1:9:ring:r:c")])
        script, client = self.serve([([first], (grpc.StatusCode.UNAVAILABLE, None)), ([part1, part2], None)])
        ring = client.join("r", member="m")
        self.assertEqual(self.take(ring, 3), [
            ("gained", "a", "v1:1:5:ring:r:a"), ("gained", "b", "v1:1:6:ring:r:b"), ("gained", "c", "v1:1:9:ring:r:c")])
        self.assertEqual(ring.shards(), ["a", "b", "c"])

    def test_losing_then_lost(self):
        first = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, ttl_seconds=60,
                                            changes=[change(K.KIND_GAINED, "a", "v1:1:5:ring:r:a")])
        losing = fencer_pb2.JoinRingResponse(changes=[change(K.KIND_LOSING, "a", "v1:1:5:ring:r:a", 2500)])
        lost = fencer_pb2.JoinRingResponse(changes=[change(K.KIND_LOST, "a", "v1:1:5:ring:r:a")])
        script, client = self.serve([([first, losing, lost], None)])
        ring = client.join("r", member="m")
        cs = []
        for c in ring.changes(timeout=5):
            cs.append(c)
            if len(cs) == 3:
                break
        self.assertEqual([(c.kind, c.shard.name, c.drain) for c in cs], [("gained", "a", None), ("losing", "a", 2.5), ("lost", "a", None)])
        self.assertIs(cs[0].shard, cs[2].shard)
        self.assertTrue(cs[0].shard.losing.is_set())
        self.assertTrue(cs[0].shard.lost.is_set())
        self.assertFalse(cs[0].shard.release(), "a handle the member no longer owns released something")
        self.assertEqual(script.released, [])

    def test_leaving_releases_losing_shards_at_once(self):
        token = "v1:1:5:ring:r:a"

        def stream(script):
            yield fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, ttl_seconds=60,
                                              changes=[change(K.KIND_GAINED, "a", token)])
            script.left.wait(5)
            yield fencer_pb2.JoinRingResponse(changes=[change(K.KIND_LOSING, "a", token, 30000)])
            script.release_came.wait(5)
            yield fencer_pb2.JoinRingResponse(changes=[change(K.KIND_LOST, "a", token)])

        script, client = self.serve([stream])
        ring = client.join("r", member="m")
        self.assertTrue(ring.leave(timeout=5), ring.error)
        self.assertEqual(script.released, ["a"])
        self.assertEqual([(c.kind, c.shard.name) for c in ring.changes(timeout=5)], [("gained", "a"), ("losing", "a"), ("lost", "a")])

    def test_session_not_found_ends_the_ring(self):
        first = fencer_pb2.JoinRingResponse(snapshot=True, member="m", session_id=7, ttl_seconds=60,
                                            changes=[change(K.KIND_GAINED, "a", "v1:1:5:ring:r:a")])
        script, client = self.serve([([first], (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"))])
        ring = client.join("r", member="m")
        got = []
        with self.assertRaises(fencer.SessionNotFoundError):
            for c in ring.changes(timeout=5):
                got.append((c.kind, c.shard.name))
        self.assertEqual(got, [("gained", "a"), ("lost", "a")])
        self.assertTrue(ring.done.is_set())
        self.assertEqual(len(script.joins), 1, "a ring whose session ended joined again")

    def test_ring_not_found_raises_from_join(self):
        script, client = self.serve([([], (grpc.StatusCode.NOT_FOUND, "RING_NOT_FOUND"))])
        with self.assertRaises(fencer.RingNotFoundError):
            client.join("r")
        self.assertEqual(client._session_id, 0)


if __name__ == "__main__":
    unittest.main()
