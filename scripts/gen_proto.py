"""Generate the API's Python stubs from layer/api/proto/qlayer/v1/queue.proto.

    python scripts/gen_proto.py            # rewrite the checked-in stubs (make proto)
    python scripts/gen_proto.py --out DIR  # write them under DIR instead (the stubs test)

Uses the protoc of the pinned grpcio-tools, so everyone gets the same bytes. protoc writes
``from qlayer.v1 import queue_pb2`` into the gRPC stub; the stubs live in the package
``layer.api.proto.qlayer.v1``, so that one import is rewritten to the full package path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "layer" / "api" / "proto"
PROTOS = ["qlayer/v1/queue.proto"]
PACKAGE = "layer.api.proto"
STUBS = ["queue_pb2.py", "queue_pb2.pyi", "queue_pb2_grpc.py"]


def generate(out: Path) -> list[Path]:
    """Write the stubs under ``out`` (as ``qlayer/v1/...``); returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")
    written = []
    for proto in PROTOS:
        folder = out / Path(proto).parent
        module = ".".join(Path(proto).parent.parts)  # qlayer.v1
        grpc_stub = folder / (Path(proto).stem + "_pb2_grpc.py")
        text = grpc_stub.read_text()
        grpc_stub.write_text(
            text.replace(f"from {module} import", f"from {PACKAGE}.{module} import")
        )
        written += [folder / name for name in STUBS]
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="where to write qlayer/v1/")
    args = parser.parse_args()
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
