"""setup.py's build of ``dlcomm._native``: native/*.cpp as one extension, optional.

The library is a speed-up, never a requirement: when the compiler is missing or fails, the
build prints a warning and ``pip install`` goes on (dlcomm.kernels then uses numpy). Flags are
portable (``-O3 -fopenmp``, no ``-march=native``): the AVX2/F16C kernels are compiled with
per-function target attributes and chosen at run time from the CPU's flags.
Set ``DLCOMM_BUILD_NATIVE=0`` to skip the build.
"""
from __future__ import annotations

import glob
import os
import sys

from setuptools import Extension
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILE_ARGS = ["-O3", "-std=c++17", "-fopenmp", "-fvisibility=hidden", "-Wall"]
LINK_ARGS = ["-fopenmp"]


def native_extensions() -> list[Extension]:
    """The ``dlcomm._native`` extension, or none when DLCOMM_BUILD_NATIVE=0."""
    if os.environ.get("DLCOMM_BUILD_NATIVE", "1") == "0":
        return []
    root = os.path.dirname(HERE)
    sources = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(HERE, "*.cpp")))
    return [Extension(
        "dlcomm._native", sources=sources, include_dirs=[os.path.relpath(HERE, root)],
        depends=[os.path.relpath(os.path.join(HERE, "dlcomm_native.h"), root)],
        language="c++", extra_compile_args=COMPILE_ARGS, extra_link_args=LINK_ARGS,
    )]


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the native kernels cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means "no native kernels"
            _warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _warn(exc)


def _warn(exc: BaseException) -> None:
    print(f"WARNING: dlcomm native kernels not built ({exc}); dlcomm uses its numpy code "
          "instead. Install g++ (with OpenMP) and reinstall for the faster kernels.",
          file=sys.stderr)
