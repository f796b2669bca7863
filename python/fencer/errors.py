"""Decoding of fencer's error model: the one place the Python client reads it.

A failed call carries a google.rpc.Status in the "grpc-status-details-bin"
trailer, with a google.rpc.ErrorInfo whose domain is "fencer.dev" and whose
reason is a string named by the generated enum fencer_pb2.ErrorReason: the
value's name minus "ERROR_REASON_" (ERROR_REASON_STALE_TOKEN is sent as
"STALE_TOKEN"). reason_string and parse_reason convert; the constants below
are derived from the enum, not copied. Debian ships no Python package for
the google.rpc protos, so the two messages are declared here from their
published definitions (wire-compatible, fields by number).
"""

import json

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

from fencer.v1 import fencer_pb2

DOMAIN = "fencer.dev"

_PREFIX = "ERROR_REASON_"


def reason_string(value):
    """Returns the ErrorInfo reason string of a fencer_pb2.ErrorReason value:
    its name minus "ERROR_REASON_". ERROR_REASON_UNSPECIFIED, which is never
    sent, gives None. Raises ValueError for a number the enum does not name."""
    if value == fencer_pb2.ERROR_REASON_UNSPECIFIED:
        return None
    return fencer_pb2.ErrorReason.Name(value)[len(_PREFIX):]


def parse_reason(reason):
    """Returns the fencer_pb2.ErrorReason value whose reason string is
    reason, or ERROR_REASON_UNSPECIFIED for None, "" and a string this
    version of the enum does not name (a newer server's reason): the gRPC
    code then tells what kind of failure it was."""
    if not reason or reason.startswith(_PREFIX):
        return fencer_pb2.ERROR_REASON_UNSPECIFIED
    try:
        return fencer_pb2.ErrorReason.Value(_PREFIX + reason)
    except ValueError:
        return fencer_pb2.ERROR_REASON_UNSPECIFIED


# The reason strings, for comparing FencerError.reason; fencer.proto
# documents what each means and what the caller should do.
STALE_TOKEN = reason_string(fencer_pb2.ERROR_REASON_STALE_TOKEN)
LEASE_NOT_HELD = reason_string(fencer_pb2.ERROR_REASON_LEASE_NOT_HELD)
HELD_BY_ANOTHER = reason_string(fencer_pb2.ERROR_REASON_HELD_BY_ANOTHER)
LOCK_DELAY = reason_string(fencer_pb2.ERROR_REASON_LOCK_DELAY)
FOREIGN_LEASE = reason_string(fencer_pb2.ERROR_REASON_FOREIGN_LEASE)
INVALID_TOKEN = reason_string(fencer_pb2.ERROR_REASON_INVALID_TOKEN)
INVALID_ARGUMENT = reason_string(fencer_pb2.ERROR_REASON_INVALID_ARGUMENT)
SESSION_NOT_FOUND = reason_string(fencer_pb2.ERROR_REASON_SESSION_NOT_FOUND)
PERMISSION_DENIED = reason_string(fencer_pb2.ERROR_REASON_PERMISSION_DENIED)
UNAUTHENTICATED = reason_string(fencer_pb2.ERROR_REASON_UNAUTHENTICATED)
WATCH_COMPACTED = reason_string(fencer_pb2.ERROR_REASON_WATCH_COMPACTED)
STORE_UNAVAILABLE = reason_string(fencer_pb2.ERROR_REASON_STORE_UNAVAILABLE)
SHUTTING_DOWN = reason_string(fencer_pb2.ERROR_REASON_SHUTTING_DOWN)
INTERNAL = reason_string(fencer_pb2.ERROR_REASON_INTERNAL)
RING_NOT_FOUND = reason_string(fencer_pb2.ERROR_REASON_RING_NOT_FOUND)
RING_CONFLICT = reason_string(fencer_pb2.ERROR_REASON_RING_CONFLICT)


def _messages():
    F = descriptor_pb2.FieldDescriptorProto
    any_file = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_file)
    f = descriptor_pb2.FileDescriptorProto(
        name="fencer/google_rpc_subset.proto", package="google.rpc", syntax="proto3",
        dependency=["google/protobuf/any.proto"])
    status = f.message_type.add(name="Status")
    status.field.add(name="code", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    status.field.add(name="message", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    status.field.add(name="details", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                     type_name=".google.protobuf.Any")
    info = f.message_type.add(name="ErrorInfo")
    info.field.add(name="reason", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    info.field.add(name="domain", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    info.field.add(name="metadata", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                   type_name=".google.rpc.ErrorInfo.MetadataEntry")
    entry = info.nested_type.add(name="MetadataEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(any_file)
    pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    return (factory.GetPrototype(pool.FindMessageTypeByName("google.rpc.Status")),
            factory.GetPrototype(pool.FindMessageTypeByName("google.rpc.ErrorInfo")))


_Status, _ErrorInfo = _messages()


def error_info(rpc_error):
    """Returns (reason, metadata dict) of a failed call's fencer.dev ErrorInfo,
    or (None, {}) when it carries none (e.g. a transport error)."""
    trailers = rpc_error.trailing_metadata() or ()
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        st = _Status.FromString(value)
        for detail in st.details:
            if detail.type_url.endswith("/google.rpc.ErrorInfo"):
                info = _ErrorInfo.FromString(detail.value)
                if info.domain == DOMAIN:
                    return info.reason, dict(info.metadata)
    return None, {}


def reason_of(rpc_error):
    """Returns the fencer.dev reason of a failed call, or None."""
    return error_info(rpc_error)[0]


class FencerError(Exception):
    """A call to fencer failed. reason is the fencer.dev ErrorInfo reason
    (None for a transport error), code the gRPC status code name, metadata
    the ErrorInfo metadata."""

    def __init__(self, message, reason=None, code=None, metadata=None):
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.metadata = dict(metadata or {})


class StaleError(FencerError):
    """The token is no longer its lease's current token; nothing was
    written. newer_token is the superseding token when the server knew it,
    else ""."""

    @property
    def token(self):
        return self.metadata.get("token", "")

    @property
    def newer_token(self):
        return self.metadata.get("newer_token", "")


class HeldError(FencerError):
    """Another holder holds the lease (an acquire with wait=False, or
    WaitTimeoutError after a bounded wait)."""

    @property
    def lease(self):
        return self.metadata.get("lease", "")

    @property
    def holder(self):
        return self.metadata.get("holder", "")


class LockDelayError(FencerError):
    """The lease is free but inside the lock-delay of its last acquisition,
    which ended without its holder's clean release; it cannot be acquired
    until the delay has passed on the store's clock."""

    @property
    def lease(self):
        return self.metadata.get("lease", "")

    @property
    def remaining_ms(self):
        """The delay's remaining time in ms when the server knew it, else None."""
        v = self.metadata.get("remaining_ms")
        return int(v) if v else None


class WaitTimeoutError(HeldError):
    """Client.acquire waited its timeout for a lease another holder held,
    and gave up. lease and holder are as the server first reported them."""

    @classmethod
    def after(cls, held, timeout):
        """Returns the WaitTimeoutError of a wait of timeout seconds that
        began with HeldError held."""
        msg = "gave up waiting for lease %s after %gs" % (json.dumps(held.lease, ensure_ascii=False), timeout)
        if getattr(held, "holder", ""):
            msg += ", held by " + held.holder
        elif isinstance(held, LockDelayError):
            msg += ", in its lock-delay"
        return cls(msg, reason=held.reason, code="DEADLINE_EXCEEDED", metadata=held.metadata)


class ForeignLeaseError(FencerError):
    """The key or resource belongs to another lease (metadata want: the
    token's lease; got: the lease that owns it); pass take_over=True to
    take it."""


class NotHeldError(FencerError):
    """The lease is not held."""


class InvalidTokenError(FencerError):
    """A token is malformed."""


class InvalidArgumentError(FencerError):
    """A request field is invalid; metadata["field"] names it."""


class SessionNotFoundError(FencerError):
    """The session has expired or was closed."""


class PermissionDeniedError(FencerError):
    """The caller's principal may not use that name, session or token."""


class UnauthenticatedError(FencerError):
    """The server did not accept the credentials."""


class RingNotFoundError(FencerError):
    """The ring has not been created (Client.create_ring creates it);
    metadata["ring"] names it."""

    @property
    def ring(self):
        return self.metadata.get("ring", "")


class RingConflictError(FencerError):
    """The ring exists with other shards, or the member name is taken in
    the ring by another session; metadata["ring"] names the ring, and
    metadata["member"] a taken member name."""

    @property
    def ring(self):
        return self.metadata.get("ring", "")

    @property
    def member(self):
        return self.metadata.get("member", "")


class UnavailableError(FencerError):
    """The server could not be reached, could not reach etcd, or is
    shutting down; retry. A write that failed so may or may not have
    committed."""


# The exception of each reason. WATCH_COMPACTED (the client re-watches),
# INTERNAL and a reason this version does not know (UNSPECIFIED) are
# classed by their gRPC code.
_BY_REASON = {
    fencer_pb2.ERROR_REASON_STALE_TOKEN: StaleError,
    fencer_pb2.ERROR_REASON_HELD_BY_ANOTHER: HeldError,
    fencer_pb2.ERROR_REASON_LOCK_DELAY: LockDelayError,
    fencer_pb2.ERROR_REASON_FOREIGN_LEASE: ForeignLeaseError,
    fencer_pb2.ERROR_REASON_LEASE_NOT_HELD: NotHeldError,
    fencer_pb2.ERROR_REASON_INVALID_TOKEN: InvalidTokenError,
    fencer_pb2.ERROR_REASON_INVALID_ARGUMENT: InvalidArgumentError,
    fencer_pb2.ERROR_REASON_SESSION_NOT_FOUND: SessionNotFoundError,
    fencer_pb2.ERROR_REASON_PERMISSION_DENIED: PermissionDeniedError,
    fencer_pb2.ERROR_REASON_UNAUTHENTICATED: UnauthenticatedError,
    fencer_pb2.ERROR_REASON_STORE_UNAVAILABLE: UnavailableError,
    fencer_pb2.ERROR_REASON_SHUTTING_DOWN: UnavailableError,
    fencer_pb2.ERROR_REASON_RING_NOT_FOUND: RingNotFoundError,
    fencer_pb2.ERROR_REASON_RING_CONFLICT: RingConflictError,
}


def from_rpc_error(rpc_error):
    """Returns the FencerError subclass instance for a failed call: the one
    place the Python client maps the error model to exceptions."""
    import grpc

    reason, md = error_info(rpc_error)
    code = rpc_error.code()
    cls = _BY_REASON.get(parse_reason(reason))
    if cls is None:
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            cls = UnavailableError
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            cls = PermissionDeniedError
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            cls = UnauthenticatedError
        else:
            cls = FencerError
    if reason is None and cls is UnavailableError:
        message = "cannot reach fencer (is `fencer serve` running? check the address and TLS settings)"
    else:
        message = rpc_error.details() or (reason or code.name)
    return cls(message, reason=reason, code=code.name, metadata=md)
