"""fencer's Python client.

    import fencer
    with fencer.Client("127.0.0.1:7890") as client:
        with client.acquire("orders") as lease:
            lease.put("orders/total", b"100")

fencer.Client holds a session renewed by a background keepalive thread;
each Lease carries its fencing token, which put, delete and txn use, and a
`lost` threading.Event. Client.join makes the session a member of a ring
(fencer.ring), whose Shards carry their tokens the same way. Errors are
fencer.errors' exceptions (StaleError, HeldError, ...). fencer.txn builds
transactions; fencer.v1 holds the generated gRPC stubs.

Runs on Debian's /usr/bin/python3 (3.11) with python3-grpcio and
python3-protobuf from apt (scripts/install-python-deps.sh).
"""

from fencer.client import Client, Lease, TxnResult
from fencer.ring import GAINED, LOSING, LOST, Change, Ring, RingMember, RingStatus, Shard
from fencer.errors import (
    FencerError,
    ForeignLeaseError,
    HeldError,
    InvalidArgumentError,
    InvalidTokenError,
    LockDelayError,
    NotHeldError,
    PermissionDeniedError,
    RingConflictError,
    RingNotFoundError,
    SessionNotFoundError,
    StaleError,
    UnauthenticatedError,
    UnavailableError,
    WaitTimeoutError,
)

__all__ = [
    "Client", "Lease", "TxnResult",
    "Ring", "Shard", "Change", "RingStatus", "RingMember", "GAINED", "LOSING", "LOST",
    "FencerError", "StaleError", "HeldError", "WaitTimeoutError", "ForeignLeaseError", "NotHeldError", "LockDelayError",
    "InvalidTokenError", "InvalidArgumentError", "SessionNotFoundError",
    "PermissionDeniedError", "UnauthenticatedError", "UnavailableError",
    "RingNotFoundError", "RingConflictError",
]
