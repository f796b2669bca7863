"""Tests of fencer.errors' reading of the error model, with no server: the
reason strings come from the generated fencer_pb2.ErrorReason enum and map
to the exceptions."""

import unittest

import grpc
from fencer import errors
from fencer.v1 import fencer_pb2

# Every reason string the service sent before the ErrorReason enum existed,
# as clients already in use compare it: the enum must produce these.
WIRE = {
    "STALE_TOKEN", "LEASE_NOT_HELD", "HELD_BY_ANOTHER", "LOCK_DELAY", "FOREIGN_LEASE",
    "INVALID_TOKEN", "INVALID_ARGUMENT", "SESSION_NOT_FOUND", "PERMISSION_DENIED",
    "UNAUTHENTICATED", "WATCH_COMPACTED", "STORE_UNAVAILABLE", "SHUTTING_DOWN", "INTERNAL",
}


class _RpcError(grpc.RpcError):
    """A failed call as grpc raises it, carrying one fencer.dev ErrorInfo."""

    def __init__(self, code, reason, metadata=None):
        info = errors._ErrorInfo(reason=reason, domain=errors.DOMAIN, metadata=metadata or {})
        st = errors._Status(code=code.value[0], message="msg")
        st.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
        self._code = code
        self._trailers = (("grpc-status-details-bin", st.SerializeToString()),)

    def code(self):
        return self._code

    def details(self):
        return "msg"

    def trailing_metadata(self):
        return self._trailers


class ErrorReasonTest(unittest.TestCase):
    def test_reason_strings_round_trip(self):
        for value in fencer_pb2.ErrorReason.values():
            name = fencer_pb2.ErrorReason.Name(value)
            with self.subTest(name):
                if value == fencer_pb2.ERROR_REASON_UNSPECIFIED:
                    self.assertIsNone(errors.reason_string(value))
                    continue
                self.assertTrue(name.startswith("ERROR_REASON_"))
                self.assertEqual(errors.reason_string(value), name[len("ERROR_REASON_"):])
                self.assertEqual(errors.parse_reason(errors.reason_string(value)), value)

    def test_wire_strings_are_unchanged(self):
        sent = {errors.reason_string(v) for v in fencer_pb2.ErrorReason.values()} - {None}
        self.assertLessEqual(WIRE, sent)
        for s in WIRE:
            self.assertEqual(getattr(errors, s), s)

    def test_unknown_reasons_parse_to_unspecified(self):
        for s in (None, "", "UNSPECIFIED", "ERROR_REASON_STALE_TOKEN", "stale_token", "SOMETHING_NEWER"):
            with self.subTest(s):
                self.assertEqual(errors.parse_reason(s), fencer_pb2.ERROR_REASON_UNSPECIFIED)

    def test_every_reason_has_an_exception_or_is_classed_by_code(self):
        by_code = {fencer_pb2.ERROR_REASON_UNSPECIFIED, fencer_pb2.ERROR_REASON_WATCH_COMPACTED,
                   fencer_pb2.ERROR_REASON_INTERNAL}
        self.assertEqual(set(errors._BY_REASON) | by_code, set(fencer_pb2.ErrorReason.values()))
        self.assertFalse(set(errors._BY_REASON) & by_code)

    def test_from_rpc_error_maps_each_reason(self):
        for reason, code, cls in (
            ("STALE_TOKEN", grpc.StatusCode.FAILED_PRECONDITION, errors.StaleError),
            ("LEASE_NOT_HELD", grpc.StatusCode.FAILED_PRECONDITION, errors.NotHeldError),
            ("HELD_BY_ANOTHER", grpc.StatusCode.FAILED_PRECONDITION, errors.HeldError),
            ("LOCK_DELAY", grpc.StatusCode.FAILED_PRECONDITION, errors.LockDelayError),
            ("FOREIGN_LEASE", grpc.StatusCode.FAILED_PRECONDITION, errors.ForeignLeaseError),
            ("INVALID_TOKEN", grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidTokenError),
            ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgumentError),
            ("SESSION_NOT_FOUND", grpc.StatusCode.NOT_FOUND, errors.SessionNotFoundError),
            ("PERMISSION_DENIED", grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDeniedError),
            ("UNAUTHENTICATED", grpc.StatusCode.UNAUTHENTICATED, errors.UnauthenticatedError),
            ("WATCH_COMPACTED", grpc.StatusCode.OUT_OF_RANGE, errors.FencerError),
            ("STORE_UNAVAILABLE", grpc.StatusCode.UNAVAILABLE, errors.UnavailableError),
            ("SHUTTING_DOWN", grpc.StatusCode.UNAVAILABLE, errors.UnavailableError),
            ("RING_NOT_FOUND", grpc.StatusCode.NOT_FOUND, errors.RingNotFoundError),
            ("RING_CONFLICT", grpc.StatusCode.ALREADY_EXISTS, errors.RingConflictError),
            ("INTERNAL", grpc.StatusCode.INTERNAL, errors.FencerError),
            ("SOMETHING_NEWER", grpc.StatusCode.UNAVAILABLE, errors.UnavailableError),
            ("SOMETHING_NEWER", grpc.StatusCode.FAILED_PRECONDITION, errors.FencerError),
        ):
            with self.subTest(reason=reason, code=code):
                err = errors.from_rpc_error(_RpcError(code, reason, {"token": "v1:1:3:orders"}))
                self.assertIs(type(err), cls)
                self.assertEqual(err.reason, reason)
                self.assertEqual(err.code, code.name)
                self.assertEqual(err.metadata, {"token": "v1:1:3:orders"})

    def test_ring_errors_name_the_ring_and_member(self):
        err = errors.from_rpc_error(_RpcError(grpc.StatusCode.ALREADY_EXISTS, "RING_CONFLICT", {"ring": "orders", "member": "w1"}))
        self.assertIsInstance(err, errors.RingConflictError)
        self.assertEqual((err.ring, err.member), ("orders", "w1"))
        err = errors.from_rpc_error(_RpcError(grpc.StatusCode.NOT_FOUND, "RING_NOT_FOUND", {"ring": "orders"}))
        self.assertIsInstance(err, errors.RingNotFoundError)
        self.assertEqual(err.ring, "orders")


if __name__ == "__main__":
    unittest.main()
