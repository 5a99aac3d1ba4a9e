"""How far the compile report's roofline estimates are from real runs: measured / estimated seconds per program.

`jaxgrpo.tools.compile` estimates a program's time without running it (`count_products`: the matrix products' roofline,
and that plus the bytes the other big operations move at HBM bandwidth). An estimate is a bound, not a
measurement: each row here is a program that ran on a real chip, timed, beside the estimates the same code gives
for it, and the report prints the nearest row's factor beside every estimate (`nearest`, `note`).

Rows come from two places:

* `MEASURED`, committed here: the runs made so far, each with its chip, jax version, configuration and date;
* device-check results (`load`): JSON files named `device_check_*.json` (a repository checkout keeps them in
  `benchmarks/results/`), which a timed run on a device writes. What is read, every other key ignored::

      {"chip": "NVIDIA H200",                  # or "env": {"chip": ..., "jax": ...} as benchmarks/device_check.py writes
       "jax_version": "0.11.2",                 # or "jax"
       "date": "2026-11-20",                    # optional
       "configuration": "Qwen3-0.6B bf16 ...",  # optional: what ran (else "model" and "shapes" where present)
       "peak_flops": 5.66e14, "hbm_bandwidth": 4.8e12,   # optional: what the estimates assumed (or "matmul":
                                                          # {"peak_flops", "bandwidth"}, as measured there)
       "update": {"packing_off": {"seconds": 1.96, "estimate_seconds": 0.649,
                                  "estimate_with_memory_seconds": 1.52},  # the last optional
                  "packing_on": {...}},
       "forward": {"seconds": ..., "estimate_seconds": ...}}  # any program, one entry or {variant: entry}

  `"train": {"packing_on": {"update_seconds": ..., "estimate_seconds": ...}, ...}` (device_check.py's form) is
  read as the update's rows. An entry without both a measured time and `estimate_seconds`, or with an "error",
  is skipped, and so is a result marked `"small": true` (a smoke test on a tiny model, not a calibration).

The factor of the products-only estimate is `factor`; of the estimate with memory-bound work, `factor_with_memory`
(None where the row did not record it). No TPU run has been measured yet: a TPU report is calibrated against the
GPU rows, and says so.
"""

from __future__ import annotations

import glob
import json
import os
from typing import NamedTuple

#: The file names `load` reads in a directory.
DEVICE_CHECK_PATTERN = "device_check_*.json"


class Calibration(NamedTuple):
    """One program timed on a real chip beside the roofline estimate the compile report's code gave for it."""

    chip: str  # the device, as jax names it (e.g. "NVIDIA H200")
    jax_version: str
    program: str  # the compile report's program name: "update", "forward", "prefill", "decode"
    configuration: str  # what ran: model, weights, dtype, rows, tokens, layout
    measured_seconds: float  # the program's time on the chip: one call (or a step's calls, beside their estimates)
    estimate_seconds: float  # the products' roofline estimate (`count_products` roofline_seconds) at the chip's figures
    date: str = ""
    packing: bool | None = None  # the update's layout, where the row is an update
    estimate_with_memory_seconds: float | None = None  # products + memory-bound work, where recorded
    peak_flops: float | None = None  # the FLOP/s and bytes/s the estimate assumed
    hbm_bandwidth: float | None = None
    source: str = "jaxgrpo.tools.calibration.MEASURED"  # how the row was obtained: a device-check file, or a note

    @property
    def factor(self) -> float:
        """Measured / products' roofline estimate."""
        return self.measured_seconds / self.estimate_seconds

    @property
    def factor_with_memory(self) -> float | None:
        """Measured / (products + memory-bound work) estimate; None where not recorded."""
        if not self.estimate_with_memory_seconds:
            return None
        return self.measured_seconds / self.estimate_with_memory_seconds

    @property
    def platform(self) -> str:
        return platform_of(self.chip)

    def where(self) -> str:
        """'an H200, jax 0.11.2' (the chip's short name)."""
        name = short_chip_name(self.chip)
        article = "an" if name[:1].upper() in "AEFHILMNORSX" else "a"
        return f"{article} {name}, jax {self.jax_version}"


#: Runs measured so far. The H200 rows: `benchmarks/device_check.py`'s GRPO step on one NVIDIA H200 with jax 0.11.2,
#: Qwen3-0.6B with random weights in bfloat16, 16 prompts x 8 samples, 512 new tokens, one update of all 128 rows
#: in micro-batches of 16 (remat on, dense XLA attention, no KL term), the update's seconds per step beside the
#: products' roofline at the matmul peak and bandwidth measured there (566 TFLOP/s, 4.8 TB/s). The run reported
#: its products' estimate only; `estimate_with_memory_seconds` is `jaxgrpo.tools.compile.count_products` (jax 0.10.2) on a
#: CPU trace of the same program at 16-token prompts, the length at which its products' estimate reproduces the
#: run's (0.649 s exactly; 1.202 against 1.196 s packed; the prompt length was not reported), at the same peak and
#: bandwidth.
_H200 = dict(chip="NVIDIA H200", jax_version="0.11.2", program="update", peak_flops=566e12, hbm_bandwidth=4.8e12,
             date="2026-11-26",
             source="benchmarks/device_check.py's update on the H200, as reported on 2026-11-26; the estimate with "
                    "memory-bound work computed afterwards on a CPU trace of the same program (16-token prompts, "
                    "where its products' estimate reproduces the run's)")
MEASURED: tuple[Calibration, ...] = (
    Calibration(**_H200, packing=False, measured_seconds=1.96, estimate_seconds=0.649,
                estimate_with_memory_seconds=1.518,
                configuration="Qwen3-0.6B random weights bf16, 16 prompts x 8 samples, 512 new tokens, packing off "
                              "(measured MFU 25.5%)"),
    Calibration(**_H200, packing=True, measured_seconds=5.85, estimate_seconds=1.196,
                estimate_with_memory_seconds=4.441,
                configuration="Qwen3-0.6B random weights bf16, 16 prompts x 8 samples, 512 new tokens, packing on: "
                              "prompt-group rows through dense XLA attention (measured MFU 6.6%)"),
)


def platform_of(chip: str) -> str:
    """'tpu' or 'gpu' from a chip's name ('TPU v5e', 'NVIDIA H200'); 'unknown' otherwise."""
    lowered = chip.lower()
    if "tpu" in lowered:
        return "tpu"
    if any(word in lowered for word in ("nvidia", "gpu", "h100", "h200", "a100", "b200", "amd", "mi300")):
        return "gpu"
    return "unknown"


def short_chip_name(chip: str) -> str:
    """'H200' for 'NVIDIA H200', 'v5e' for 'TPU v5e' (the name without its vendor)."""
    words = [w for w in chip.split() if w.lower() not in ("nvidia", "tpu", "google")]
    return " ".join(words) or chip


def from_device_check(data: dict, source: str = "") -> list[Calibration]:
    """The rows of one device-check result (the schema in this module's docstring)."""
    if data.get("small"):
        return []
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    matmul = data.get("matmul") if isinstance(data.get("matmul"), dict) else {}
    chip = str(data.get("chip") or env.get("chip") or "unknown")
    version = str(data.get("jax_version") or data.get("jax") or env.get("jax") or "?")
    configuration = data.get("configuration") or ", ".join(
        str(part) for part in (data.get("model"), _shapes(data.get("shapes"))) if part)
    programs = {k: v for k, v in data.items() if k in PROGRAM_NAMES and isinstance(v, dict)}
    if isinstance(data.get("train"), dict) and "update" not in programs:
        programs["update"] = data["train"]
    rows = []
    for program, entry in programs.items():
        variants = {"": entry} if "estimate_seconds" in entry else entry
        for variant, figures in variants.items():
            if not isinstance(figures, dict) or "error" in figures:
                continue
            seconds = figures.get("seconds", figures.get("update_seconds"))
            estimate, with_memory = figures.get("estimate_seconds"), figures.get("estimate_with_memory_seconds")
            if not _positive(seconds) or not _positive(estimate):
                continue
            rows.append(Calibration(
                chip=chip, jax_version=version, program=program,
                configuration=", ".join(part for part in (configuration, variant.replace("_", " ")) if part),
                measured_seconds=float(seconds), estimate_seconds=float(estimate), date=str(data.get("date") or ""),
                packing={"packing_on": True, "packing_off": False}.get(variant, figures.get("packing")),
                estimate_with_memory_seconds=float(with_memory) if _positive(with_memory) else None,
                peak_flops=data.get("peak_flops", matmul.get("peak_flops")),
                hbm_bandwidth=data.get("hbm_bandwidth", matmul.get("bandwidth")), source=source))
    return rows


#: The programs a device-check result may time, by the compile report's names.
PROGRAM_NAMES = ("update", "forward", "prefill", "decode")


def _shapes(shapes) -> str:
    if not isinstance(shapes, dict):
        return ""
    return ", ".join(f"{k} {v}" for k, v in shapes.items())


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def load(paths=()) -> list[Calibration]:
    """`MEASURED` and the rows of every device-check result in `paths` (files, or directories holding
    `device_check_*.json`). A path that does not exist is skipped; so is a file that is not a JSON object."""
    rows = list(MEASURED)
    for path in paths:
        files = sorted(glob.glob(os.path.join(path, DEVICE_CHECK_PATTERN))) if os.path.isdir(path) else [path]
        for name in files:
            try:
                with open(name) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                rows += from_device_check(data, source=name)
    return rows


def nearest(rows, chip: str, program: str, packing: bool | None = None) -> Calibration | None:
    """The row that best stands for `program` on `chip`: the same program only; then the same chip, else the same
    platform (TPU, GPU), else a GPU's (a TPU report is calibrated by a GPU run while no TPU run exists); then the
    same packing layout where known; then a row with the estimate with memory-bound work; the newest date last."""
    candidates = [r for r in rows if r.program == program]
    if not candidates:
        return None
    platform = platform_of(chip)

    def rank(row: Calibration):
        return (row.chip == chip, row.platform == platform != "unknown", row.platform == "gpu",
                packing is not None and row.packing == packing, row.estimate_with_memory_seconds is not None, row.date)

    return max(candidates, key=rank)


def provenance(row: Calibration, chip: str) -> str:
    """Where `row` was measured, for a figure about `chip`: 'an H200, jax 0.11.2', with ': a GPU; no TPU run
    measured yet' where it is another platform's, ': another GPU' where another chip's."""
    platform = platform_of(chip)
    caveat = ""
    if row.platform != platform:
        caveat = f": a {row.platform.upper()}" + (f"; no {platform.upper()} run measured yet" if platform != "unknown"
                                                   else "")
    elif row.chip != chip:
        caveat = f": another {row.platform.upper()}"
    return row.where() + caveat


def note(row: Calibration | None, chip: str, with_memory: bool = False) -> str:
    """What to print beside an estimated time: 'measured 3.0x this on an H200, jax 0.11.2' (`provenance`), or that
    no run calibrates it."""
    if row is None:
        return "no measured run of this program to calibrate against"
    factor = row.factor_with_memory if with_memory else row.factor
    if factor is None:
        return f"not calibrated: the run on {row.where()} recorded only the products' estimate"
    return f"measured {factor:.1f}x this on {provenance(row, chip)}"
