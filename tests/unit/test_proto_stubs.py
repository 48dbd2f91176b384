"""The checked-in protobuf stubs are what queue.proto generates: nobody edits one alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUB_DIR = ROOT / "layer" / "api" / "proto" / "qlayer" / "v1"


def _gen_proto() -> object:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_stubs_match_the_proto(tmp_path: Path) -> None:
    written = _gen_proto().generate(tmp_path)  # type: ignore[attr-defined]
    assert sorted(p.name for p in written) == ["queue_pb2.py", "queue_pb2.pyi", "queue_pb2_grpc.py"]
    stale = [p.name for p in written if p.read_bytes() != (STUB_DIR / p.name).read_bytes()]
    assert not stale, (
        f"{', '.join(stale)} differ from what queue.proto generates: run `make proto` and commit"
        " the stubs with the .proto"
    )


def test_the_grpc_stub_imports_the_messages_from_this_package() -> None:
    from layer.api.proto.qlayer.v1 import queue_pb2, queue_pb2_grpc

    assert queue_pb2_grpc.qlayer_dot_v1_dot_queue__pb2 is queue_pb2
    assert hasattr(queue_pb2_grpc, "QueueServiceStub")
