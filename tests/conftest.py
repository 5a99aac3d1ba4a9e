"""Every test sees 8 fake CPU devices, so sharded code paths run on any machine."""

import collections
import gc
import os
import subprocess
import sys

from tests.support.paths import REPO_ROOT

# Must happen before jax is imported anywhere in the test session.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags = (_flags + " --xla_force_host_platform_device_count=8").strip()
# LLVM at -O0 rather than -O2: the suite's programs are small and compiled once each, so compiling is most of
# their time: 3323 of the 5439 test seconds of CI's tier on a 2-core AMD EPYC (AVX2), summed from jax's compile
# events, at -O1. Measured side by side there (one process, 39 compile-bound tests of test_generate.py,
# test_models_decoder.py and two kernels' training runs): -O1 164 s (115 s compiling), -O1 with LLVM's expensive
# passes off 133 s (91), -O0 106 s (64); the 9 tests that run SmolLM2's real weights longest took 173 s at -O1 and
# 201 s at -O0, a cost that compiling faster repays many times over. The programs compute the same functions; only
# the machine code differs, as it does between CPU families (the recorded metrics' tolerance covers both).
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA accepts `flag`: XLA aborts a process on a flag it does not know, so a child asks."""
    env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                          timeout=300).returncode == 0


# Fusions through XLA:CPU's elemental IR emitter rather than its MLIR fusion emitters (the default), whose own
# pipeline is most of a small program's compile once LLVM runs at -O0. Measured on a 2-core AMD EPYC (AVX2): 41
# tests of test_generate.py and test_models_decoder.py in one process took 86 s (57 s compiling) with the fusion
# emitters, 47 s (20 s) without; CI's tier 2433 s (4750 test seconds, 2448 compiling) against 1641 s (3162, 1107
# of them compiling, 249 of those libtpu's), every test passing both ways. At -O1 the elemental emitter compiles
# no faster than the fusion emitters at -O0 (86 s), so the two settings go together. Later XLAs
# retire the flag (openxla/xla#48001) and abort on a flag they do not know: it is set only where this jaxlib
# accepts it, asked once by the session's first process (pytest-xdist's workers inherit the environment).
_ELEMENTAL_EMITTER = "--xla_cpu_use_fusion_emitters=false"
if ("xla_cpu_use_fusion_emitters" not in _flags and "PYTEST_XDIST_WORKER" not in os.environ
        and _xla_knows(_ELEMENTAL_EMITTER)):
    _flags += " " + _ELEMENTAL_EMITTER
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache: with 8 fake CPU devices, a trainer update loaded from it (compiled
# by an earlier test with identical HLO) deadlocked in an all-gather rendezvous and aborted the session
# (jaxlib 0.10.2), and the whole suite ran no faster with it (16 min either way).
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run, so CI is reproducible; HYPOTHESIS_PROFILE=explore
# draws fresh random ones (run it when changing a kernel).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



def pytest_configure(config):
    """A worker that crashes (a segfault in a compiler) fails its test and ends the run, instead of being replaced.

    With `--dist loadfile`, pytest-xdist 3.8 re-queues a crashed worker's file, the replacement crashes on the
    same test, and the session can then wait forever for work it never sends (pytest-dev/pytest-xdist#784,
    #1378): measured here, a segfault at 93% left CI idle until its time limit. A crash is a failure to look at.
    """
    if hasattr(config.option, "maxworkerrestart"):
        config.option.maxworkerrestart = 0


#: Seconds each test file took (setup, call and teardown of its tests), and of them the seconds XLA compiled in
#: the test's process, summed where the reports arrive: in the controller of an xdist session, whose workers
#: forward every report.
_FILE_SECONDS: collections.Counter = collections.Counter()
_FILE_COMPILING: collections.Counter = collections.Counter()
#: XLA's compile seconds in this process since the last test phase's report (jax's monitoring events).
_compiling = [0.0]


def _count_compiling(event: str, seconds: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiling[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compiling)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.user_properties.append(("xla_compile_seconds", _compiling[0]))  # travels with the report to the controller
    _compiling[0] = 0.0
    return report


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] += report.duration
    _FILE_COMPILING[path] += dict(report.user_properties).get("xla_compile_seconds", 0.0)


def pytest_terminal_summary(terminalreporter):
    """The 15 slowest test files after `--durations`' slowest tests: where the suite's time goes, file by file
    (`--dist loadfile` schedules whole files, so a file is the unit to trim or split), and how much of it XLA
    spent compiling (in the test's own process; not in the processes a test starts)."""
    if not _FILE_SECONDS:
        return
    total, compiling = sum(_FILE_SECONDS.values()), sum(_FILE_COMPILING.values())
    terminalreporter.write_sep("=", f"slowest 15 of {len(_FILE_SECONDS)} test files (seconds, all their tests; "
                                    f"XLA compiling {compiling:.0f} of {total:.0f})")
    for path, seconds in _FILE_SECONDS.most_common(15):
        terminalreporter.write_line(f"{seconds:8.1f}s {path} (compiling {_FILE_COMPILING[path]:.1f}s)")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled program after each test file, so a test worker's memory map stays small.

    XLA:CPU maps each compiled program's code and data as their own memory regions, and jax's caches keep
    every program alive. One worker running half the suite compiles enough of them to reach Linux's
    `vm.max_map_count` (65530 regions per process); the next compile's mmap then fails and LLVM's memory
    manager segfaults (measured: a worker at 25k regions a third of the way through; crashes in
    `backend_compile_and_load` in whichever test came next; cf. jax-ml/jax#27201).
    """
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def users_matmul_precision():
    """jax's default matmul precision, as `jaxgrpo-compile` compiles for a user, for a test compiling TPU programs.

    The suite's "highest" (set above for the CPU's numerics) makes every float32 product on a TPU six bfloat16
    passes: larger programs than a user's, whose report would differ, and slower to compile (the quickstart's
    programs for a v5e-8: 76 s at "highest", 45 s at the default, on a 2-core AMD EPYC)."""
    with jax.default_matmul_precision("default"):
        yield


SHARED = os.path.abspath(os.path.join(REPO_ROOT, "..", "shared"))


@pytest.fixture(scope="session")
def shared_dir():
    """../shared beside the project: GSM8K and the method catalog for tests."""
    if not os.path.isdir(SHARED):
        pytest.fail(f"expected the shared directory at {SHARED} (CI places it beside the project)")
    return SHARED


@pytest.fixture(scope="session")
def mesh_2x4():
    """A (data=2, model=4) mesh of the 8 fake devices, with Auto axes."""
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
