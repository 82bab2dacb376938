"""Deckard's proto compiled by the installed grpcio-tools into the facade's package (not committed:
the generated code must match the grpcio and protobuf runtimes it runs with).

``make install`` runs it whenever the proto changes (``python proto/generate_deckard.py``);
``setup.py`` runs :func:`generate` with ``force=False``, so a wheel built from a clean checkout
carries the code. The include root stays ``proto/`` so the descriptor is named
``deckard_service.proto`` (K1); the gRPC module's top-level import of its message module is made
package-relative.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "boxqueue" / "facades" / "deckard" / "generated"
STUB = OUT / "deckard_service_pb2_grpc.py"


def generate(force: bool = True) -> None:
    if not force and STUB.exists():
        return
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/any.proto...
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{well_known}", f"--python_out={OUT}", f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}", str(ROOT / "proto" / "deckard_service.proto")]
    if protoc.main(args) != 0:
        sys.exit("boxqueue: grpc_tools.protoc could not compile proto/deckard_service.proto")
    text, count = re.subn(r"^import deckard_service_pb2 as", "from . import deckard_service_pb2 as",
                          STUB.read_text(), flags=re.M)
    if count != 1:
        sys.exit(f"boxqueue: unexpected code in {STUB}")
    STUB.write_text(text)


if __name__ == "__main__":
    generate()
