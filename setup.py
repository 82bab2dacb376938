"""Builds the Cython extensions of the hot path, and Deckard's generated gRPC code where a clean
checkout lacks it; everything else is in pyproject.toml.

The list of compiled modules lives in ``boxqueue/compiled.py`` (read here without importing the
package). Each is compiled from its own ``.py`` file, in Cython's pure-Python mode.
"""

import os
import runpy
import shutil
import sys
import sysconfig

from Cython.Build import cythonize
from setuptools import Extension, setup

compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
if shutil.which(compiler) is None:
    sys.exit(
        f"boxqueue needs a C compiler to build its compiled request path: '{compiler}' was not "
        "found (on Debian: apt-get install gcc)."
    )


runpy.run_path("proto/generate_deckard.py")["generate"](force=False)  # where a clean checkout lacks it
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
