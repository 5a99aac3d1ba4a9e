"""Building, loading and registering jaxgrpo's C++ kernels for XLA:CPU (XLA FFI custom calls).

The kernels (`cpu_attention.cc`, `cpu_matmul.cc` and their `cpu_parallel.h`, shipped as package data)
are compiled together at first use with the C++ compiler (`$CXX`, else `g++`) for this machine
(`-march=native`) into `$XDG_CACHE_HOME/jaxgrpo` (else `~/.cache/jaxgrpo`), keyed by the sources, the
flags and the jax version, and each is registered as an XLA FFI target when this CPU has what it needs. Wherever a kernel
cannot be built or used, the decoder runs its XLA form; `JAXGRPO_CPU_ATTENTION=0` and
`JAXGRPO_CPU_MATMUL=0` turn the kernels off one by one.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

import jax

logger = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name) for name in ("cpu_attention.cc", "cpu_matmul.cc"))
HEADERS = (os.path.join(_HERE, "cpu_parallel.h"),)  # included by the sources: part of the build's key
# No -ffast-math: linked into a shared library it sets flush-to-zero for the whole process on load.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")


def _library_path(compiler: str) -> str:
    digest = hashlib.sha256(repr((FLAGS, compiler, jax.__version__)).encode())
    for source in SOURCES + HEADERS:
        with open(source, "rb") as f:
            digest.update(f.read())
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jaxgrpo", f"cpu_kernels-{digest.hexdigest()[:16]}.so")


def _build(compiler: str, path: str) -> None:
    """Compiles the library to `path` (written to a temporary file first, so concurrent builds are safe)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", scratch, *SOURCES]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel library (built at the first call), or None with a logged reason."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.info("no C++ compiler (CXX or g++): the decoder runs its XLA forms")
        return None
    path = _library_path(compiler)
    try:
        if not os.path.exists(path):
            logger.info("building jaxgrpo's CPU kernels: %s", path)
            _build(compiler, path)
        return ctypes.cdll.LoadLibrary(path)
    except (OSError, RuntimeError) as error:
        logger.warning("jaxgrpo's CPU kernels could not be built (%s): the decoder runs its XLA forms", error)
        return None


@functools.cache
def register(target: str, switch: str, needs: str) -> bool:
    """Whether FFI target `target` is registered for the CPU platform: False when the environment
    variable `switch` is "0", without the library, or when the library's `{target}_available()` says
    this CPU lacks `needs` (e.g. "AVX-512"), each with a logged reason."""
    if os.environ.get(switch, "1") == "0":
        return False
    lib = library()
    if lib is None:
        return False
    if not getattr(lib, f"{target}_available")():
        logger.info("this CPU has no %s: %s runs as XLA operations", needs, target)
        return False
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)), platform="cpu")
    return True
