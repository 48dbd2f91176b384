"""Generated protobuf stubs of the API (see scripts/gen_proto.py)."""
