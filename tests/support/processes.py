"""The environment of a process a test starts: this checkout importable, the CPU with as many devices as the test
asks (one, as a user's run has, unless it says), and the suite's compile settings (tests/conftest.py), so a child
compiles as fast as the tests do."""

from __future__ import annotations

import os

from tests.support.paths import REPO_ROOT

_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def xla_flags(devices: int = 1) -> str:
    """The session's XLA_FLAGS with `devices` CPU devices in place of conftest's 8 fake ones."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT)]
    return " ".join(flags + ([f"{_DEVICE_COUNT}={devices}"] if devices != 1 else []))


def child_env(devices: int = 1, **overrides: str) -> dict:
    """The session's environment for a child process on `devices` CPU devices, with `overrides` on top."""
    return dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices), **overrides)
