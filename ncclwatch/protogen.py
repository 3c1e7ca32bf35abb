"""Generate the gRPC/protobuf code in ``ncclwatch/v1`` from ``proto/``.

Run by ``make proto``; the test suite calls :func:`generate` into a scratch
directory and compares, so a proto edit without regeneration fails CI.
Needs grpcio-tools (a dev/test dependency), pinned so output is stable.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUTPUTS = ("collector_pb2.py", "collector_pb2.pyi", "collector_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "ncclwatch" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Write generated modules under ``out_dir/ncclwatch/v1``; return their paths."""
    from grpc_tools import protoc  # dev dependency, imported only here

    (out_dir / "ncclwatch" / "v1").mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "ncclwatch" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    written = generate(ROOT)
    for path in written:
        print(f"generated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
