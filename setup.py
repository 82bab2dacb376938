"""Builds the Cython extensions of the hot path, and Deckard's generated gRPC code where a clean
checkout lacks it; everything else is in pyproject.toml.

The list of compiled modules lives in ``boxqueue/compiled.py`` (read here without importing the
package). Each is compiled from its own ``.py`` file, in Cython's pure-Python mode.
"""

import os
import re
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
if shutil.which(compiler) is None:
    sys.exit(
        f"boxqueue needs a C compiler to build its compiled request path: '{compiler}' was not "
        "found (on Debian: apt-get install gcc)."
    )


def generate_deckard_code() -> None:
    """``proto/deckard_service.proto`` compiled by the pinned grpcio-tools into the facade's
    package, as ``make install`` does (the code is not committed: it must match the grpcio and
    protobuf runtimes), when it is missing: a wheel built from a clean checkout carries it."""
    out = Path("facades/deckard/generated")
    if (out / "deckard_service_pb2_grpc.py").exists():
        return
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/any.proto...
    args = ["protoc", "-Iproto", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", "proto/deckard_service.proto"]
    if protoc.main(args) != 0:
        sys.exit("boxqueue: grpc_tools.protoc could not compile proto/deckard_service.proto")
    stub = out / "deckard_service_pb2_grpc.py"
    # the gRPC module imports its message module as a top-level name; inside the package it is relative
    text, count = re.subn(r"^import deckard_service_pb2 as", "from . import deckard_service_pb2 as",
                          stub.read_text(), flags=re.M)
    if count != 1:
        sys.exit(f"boxqueue: unexpected code in {stub}")
    stub.write_text(text)


generate_deckard_code()
modules = runpy.run_path("boxqueue/compiled.py")["COMPILED_MODULES"]
extensions = [Extension(name, [name.replace(".", "/") + ".py"]) for name in modules]

setup(
    # both cores (or more) compile at once, as `make build` asks with -j
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            # Annotations stay documentation unless a module opts in with a directive comment:
            # `list[Any]` must not start refusing tuples at run time.
            "annotation_typing": False,
        },
        quiet=True,
    ),
)
