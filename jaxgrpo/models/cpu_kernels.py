"""Building, loading and registering jaxgrpo's C++ kernels for XLA:CPU (XLA FFI custom calls).

The kernels (`cpu_attention.cc`, `cpu_matmul.cc` and their `cpu_parallel.h`, shipped as package data)
are compiled together at first use with the C++ compiler (`$CXX`, else `g++`) for this machine
(`-march=native`) into `$XDG_CACHE_HOME/jaxgrpo` (else `~/.cache/jaxgrpo`), and each is registered as an
XLA FFI target when this CPU has what it needs. Wherever a kernel cannot be built or used, the decoder
runs its XLA form; `JAXGRPO_CPU_ATTENTION=0` and `JAXGRPO_CPU_MATMUL=0` turn the kernels off one by one.

The cache may be a home directory shared by machines of different CPUs (a cluster), so a library is
keyed by the sources, the flags, the compiler and its version, the jax version and this CPU's feature
flags: a library built for other instructions is never loaded. Beside it, a small JSON record holds its
SHA-256 and the CPU features it was built for; a library that does not match its record (truncated by a
full disk or a killed build, emptied, corrupt) would crash the process when loaded, so it is rebuilt
instead, with one warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile

import jax

from jaxgrpo.models.attention import target_platform

logger = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name) for name in ("cpu_attention.cc", "cpu_matmul.cc"))
HEADERS = (os.path.join(_HERE, "cpu_parallel.h"),)  # included by the sources: part of the build's key
# No -ffast-math: linked into a shared library it sets flush-to-zero for the whole process on load.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")


def cpu_features() -> str:
    """What `-march=native` compiles for: this CPU's feature flags (Linux), else the platform's name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, Arm
                    return " ".join(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _compiler_version(compiler: str) -> str:
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else "unknown"


def _library_path(compiler: str, features: str) -> str:
    digest = hashlib.sha256(repr((FLAGS, compiler, _compiler_version(compiler), jax.__version__, features)).encode())
    for source in SOURCES + HEADERS:
        with open(source, "rb") as f:
            digest.update(f.read())
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jaxgrpo", f"cpu_kernels-{digest.hexdigest()[:16]}.so")


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _record(path: str) -> str:
    return path + ".json"


def _cached_problem(path: str, features: str) -> str | None:
    """Why the cached library at `path` must not be loaded, or None when it matches its record."""
    try:
        with open(_record(path)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return "its record is missing or unreadable"
    if record.get("cpu_features") != features:
        return "it was built for another CPU"
    if record.get("sha256") != _sha256(path):
        return "it is truncated or corrupt"
    return None


def _build(compiler: str, path: str, features: str) -> None:
    """Compiles the library to `path` with its record (written to temporary files first and renamed, library
    first, so concurrent builds are safe and an interrupted one leaves a library without a valid record)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", scratch, *SOURCES]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        record = json.dumps({"sha256": _sha256(scratch), "cpu_features": features})
        with open(scratch + ".json", "w") as f:
            f.write(record)
        os.replace(scratch, path)
        os.replace(scratch + ".json", _record(path))
    finally:
        for leftover in (scratch, scratch + ".json"):
            if os.path.exists(leftover):
                os.remove(leftover)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel library (built at the first call), or None with a logged reason."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.info("no C++ compiler (CXX or g++): the decoder runs its XLA forms")
        return None
    features = cpu_features()
    path = _library_path(compiler, features)
    try:
        if not os.path.exists(path):
            logger.info("building jaxgrpo's CPU kernels: %s", path)
            _build(compiler, path, features)
        elif (problem := _cached_problem(path, features)) is not None:
            logger.warning("the cached CPU kernel library %s is not loaded (%s): rebuilding it", path, problem)
            _build(compiler, path, features)
        return ctypes.cdll.LoadLibrary(path)
    except (OSError, RuntimeError) as error:
        logger.warning("jaxgrpo's CPU kernels could not be built (%s): the decoder runs its XLA forms", error)
        return None


def targets_cpu(mesh) -> bool:
    """Whether a program laid out on `mesh` (None: the default devices) runs on CPUs (the mesh's devices
    decide, not the default backend: `jaxgrpo.models.attention.target_platform`)."""
    return target_platform(mesh) == "cpu"


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
