"""Generated from proto/fencer/v1/fencer.proto by scripts/proto.sh."""
