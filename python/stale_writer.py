"""A Python writer that gets fenced: the script the service's Python test runs.

1. Acquires LEASE with a short TTL and writes KEY with its token.
2. Prints {"step": "wrote", "token": ...} and waits for a line on stdin,
   renewing nothing (a paused writer), so its lease expires.
3. Writes KEY again with the same token and prints the outcome:
   {"step": "late", "code": ..., "reason": ..., "newer_token": ...}.

Environment: FENCER_SERVER (host:port), FENCER_AUTH_TOKEN (bearer token).
Usage: /usr/bin/python3 stale_writer.py LEASE KEY
"""

import json
import os
import sys

import grpc

from fencer import errors
from fencer.v1 import fencer_pb2, fencer_pb2_grpc


def main():
    lease, key = sys.argv[1], sys.argv[2]
    channel = grpc.insecure_channel(os.environ["FENCER_SERVER"])
    stub = fencer_pb2_grpc.FencerServiceStub(channel)
    auth = (("authorization", "Bearer " + os.environ["FENCER_AUTH_TOKEN"]),)

    acq = stub.Acquire(fencer_pb2.AcquireRequest(name=lease, ttl_seconds=2), metadata=auth, timeout=10)
    stub.Put(fencer_pb2.PutRequest(token=acq.token, key=key, value=b"python"), metadata=auth, timeout=10)
    print(json.dumps({"step": "wrote", "token": acq.token, "holder": acq.holder}), flush=True)

    sys.stdin.readline()

    out = {"step": "late"}
    try:
        stub.Put(fencer_pb2.PutRequest(token=acq.token, key=key, value=b"python-late"), metadata=auth, timeout=10)
        out["code"] = "OK"
    except grpc.RpcError as e:
        reason, md = errors.error_info(e)
        out.update(code=e.code().name, reason=reason, newer_token=md.get("newer_token", ""))
    print(json.dumps(out), flush=True)
    channel.close()


if __name__ == "__main__":
    main()
