"""Builders for Client.txn and Lease.txn: compares and operations.

    from fencer import txn
    lease.txn(compares=[txn.value("orders/state", "=", b"open")],
              success=[txn.put("orders/state", b"closed")],
              failure=[txn.get("orders/state")])

OP is one of "=", "!=", ">", "<". version 0 means the key does not exist.
"""

from fencer.v1 import fencer_pb2

_RESULTS = {
    "=": fencer_pb2.Compare.RESULT_EQUAL,
    "!=": fencer_pb2.Compare.RESULT_NOT_EQUAL,
    ">": fencer_pb2.Compare.RESULT_GREATER,
    "<": fencer_pb2.Compare.RESULT_LESS,
}


def _compare(key, op, target, **operand):
    if op not in _RESULTS:
        raise ValueError("operator %r: want =, !=, > or <" % (op,))
    return fencer_pb2.Compare(key=key, target=target, result=_RESULTS[op], **operand)


def value(key, op, v):
    """Compares key's value with v (bytes or str)."""
    return _compare(key, op, fencer_pb2.Compare.TARGET_VALUE, value=v.encode() if isinstance(v, str) else bytes(v))


def version(key, op, n):
    """Compares the number of writes to key since its creation with n."""
    return _compare(key, op, fencer_pb2.Compare.TARGET_VERSION, number=n)


def create(key, op, n):
    """Compares key's creation revision with n."""
    return _compare(key, op, fencer_pb2.Compare.TARGET_CREATE_REVISION, number=n)


def mod(key, op, n):
    """Compares key's last-write revision with n."""
    return _compare(key, op, fencer_pb2.Compare.TARGET_MOD_REVISION, number=n)


def put(key, v):
    """Writes key."""
    return fencer_pb2.Op(put=fencer_pb2.PutOp(key=key, value=v.encode() if isinstance(v, str) else bytes(v)))


def delete(key):
    """Deletes key."""
    return fencer_pb2.Op(delete=fencer_pb2.DeleteOp(key=key))


def get(key):
    """Reads key."""
    return fencer_pb2.Op(get=fencer_pb2.GetOp(key=key))
