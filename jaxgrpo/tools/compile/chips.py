"""The TPU chips a compile report is for: each generation's published figures, and a topology's devices from
libtpu (`jax.experimental.topologies`), on a machine without a TPU."""

from __future__ import annotations

import os
from typing import NamedTuple


GiB = 1 << 30


class Chip(NamedTuple):
    """One TPU chip's published figures: bfloat16 peak FLOP/s, HBM bytes and HBM bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    hbm_bytes: int
    hbm_bandwidth: float


#: Per-chip figures from the Cloud TPU system-architecture pages (v4, v5e, v5p, v6e "Trillium").
CHIPS = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1640e9),
}
EXAMPLE_TOPOLOGIES = "v5e:2x4, v5e:4x4, v5p:2x2x1, v5p:4x4x4, v6e:2x4, v4:2x2x2"


def topology_devices(topology: str) -> tuple[Chip, list]:
    """(the chip, the devices) of a TPU topology such as "v5e:2x4"; one-line errors for what cannot be had."""
    generation = topology.split(":", 1)[0]
    if ":" not in topology or generation not in CHIPS:
        raise ValueError(f"unknown TPU topology {topology!r}: write GENERATION:SHAPE with GENERATION one of "
                         f"{', '.join(CHIPS)}, e.g. {EXAMPLE_TOPOLOGIES}")
    # libtpu takes a machine-wide lock when it loads, meant for processes that drive TPU chips; a process that
    # only compiles (this one runs on CPUs) must not fail because another compiling process holds it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401  (the TPU compiler; nothing else here needs it)
    except ImportError:
        raise RuntimeError('compiling for a TPU needs libtpu: pip install "jax[tpu]==0.10.2" '
                           '(or pip install -e ".[tpu]")') from None
    from jax.experimental import topologies

    try:
        devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    except Exception as error:  # libtpu's errors are long; keep the first line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"libtpu cannot lay out the topology {topology!r} ({first}); "
                         f"valid examples: {EXAMPLE_TOPOLOGIES}") from None
    return CHIPS[generation], list(devices)
