"""Decoding of fencer's error model: the one place the Python client reads it.

A failed call carries a google.rpc.Status in the "grpc-status-details-bin"
trailer, with a google.rpc.ErrorInfo whose domain is "fencer.dev" and whose
reason is one of the constants below. Debian ships no Python package for the
google.rpc protos, so the two messages are declared here from their
published definitions (wire-compatible, fields by number).
"""

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

DOMAIN = "fencer.dev"

STALE_TOKEN = "STALE_TOKEN"
LEASE_NOT_HELD = "LEASE_NOT_HELD"
HELD_BY_ANOTHER = "HELD_BY_ANOTHER"
FOREIGN_LEASE = "FOREIGN_LEASE"
INVALID_TOKEN = "INVALID_TOKEN"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNAUTHENTICATED = "UNAUTHENTICATED"
WATCH_COMPACTED = "WATCH_COMPACTED"
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
SHUTTING_DOWN = "SHUTTING_DOWN"
INTERNAL = "INTERNAL"


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
