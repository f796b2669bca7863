"""A ring worker, run as a process of its own by test_ring (which kills it
with SIGKILL) and by cmd/fencer's TestPythonRingRidesOutAServerRestart:
it joins RING as MEMBER with a session of TTL seconds and, every 50 ms, writes "<RING>/<shard>" = MEMBER with the token
of each shard it owns. It hands a shard off as soon as it is reported
losing. It prints one JSON line per change, {"kind", "shard", "token"},
one per shard token's first write (and first after a failure to reach
the server), {"wrote", "token"}, and one per write refused as stale,
{"stale", "token"}, or failed as unavailable, {"unavailable", "token"}.

Environment: FENCER_SERVER. Usage: python3 ring_worker.py RING MEMBER TTL
"""

import json
import sys

import fencer


def say(**fields):
    print(json.dumps(fields), flush=True)


def main():
    ring_name, member, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with fencer.Client(ttl=ttl) as client:
        with client.join(ring_name, member=member, drain=10) as ring:
            written = set()
            while True:
                for change in ring.changes(timeout=0.05):
                    say(kind=change.kind, shard=change.shard.name, token=change.shard.token)
                    if change.kind == fencer.LOSING:
                        change.shard.release()
                for name in ring.shards():
                    shard = ring.owns(name)
                    if shard is None or shard.losing.is_set():
                        continue
                    try:
                        shard.put("%s/%s" % (ring_name, name), member)
                    except fencer.StaleError:
                        say(stale=name, token=shard.token)
                        continue
                    except fencer.UnavailableError:
                        say(unavailable=name, token=shard.token)
                        written.discard(shard.token)  # its next write is reported again
                        continue
                    if shard.token not in written:
                        written.add(shard.token)
                        say(wrote=name, token=shard.token)


if __name__ == "__main__":
    main()
