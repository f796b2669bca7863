"""fencer's Python client: generated gRPC stubs (fencer.v1) and error decoding.

Use fencer.v1.fencer_pb2 / fencer_pb2_grpc for the calls and
fencer.errors.reason_of to read the fencer.dev ErrorInfo reason of a failed
call. Needs Debian's python3-grpcio and python3-protobuf
(scripts/install-python-deps.sh).
"""
