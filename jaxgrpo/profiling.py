"""Where a compiled step spends its time: a `jax.profiler` trace, attributed to named scopes.

    compiled = jax.jit(step).lower(*args).compile()
    breakdown = profiling.time_by_scope(compiled, args, profiling.MODEL_SCOPES)
    print(profiling.markdown(breakdown))

`time_by_scope` runs the compiled program under `jax.profiler.trace`, reads the per-HLO-instruction
events of the trace (each names its module and instruction), looks up every instruction's `op_name`
in the compiled HLO's metadata (the JAX call path, `jax.named_scope`s included) and sums each
instruction's *exclusive* time (a while loop's own time, without the instructions of its body) under
the first scope its path contains. The decoder, the log-prob head, the sampler and the trainer's
update name their parts (`attention/qkv`, `mlp`, `logprob_head`, `sampling`, `optimizer`, ...), and
backward-pass instructions (whose path contains `transpose(`) are counted apart from forward ones.

The numbers are the device's own: on CPU the XLA runtime's per-thunk events, on GPU/TPU the device
ops. The trace adds overhead per instruction, so compare the shares, not the seconds, with untraced
timings; `coverage` says how much of the wall time the attributed instructions account for.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax

#: (scope in the op_name path, label), most specific first: the first match names an instruction.
MODEL_SCOPES: tuple[tuple[str, str], ...] = (
    ("sampling", "sampling (temperature, truncation, draw)"),
    ("logprob_head", "log-prob head (unembedding + log-softmax, chunked)"),
    ("unembed", "unembedding (logits)"),
    ("attention/qkv", "attention q/k/v projections (+ RoPE, q/k norm)"),
    ("attention/core", "attention scores, softmax and values (cache reads)"),
    ("attention/out", "attention output projection"),
    ("mlp", "MLP (gate, up, down)"),
    ("norm", "RMSNorm"),
    ("kv_cache_write", "KV cache write"),
    ("embed", "embedding lookup"),
    ("optimizer", "optimizer (AdamW update)"),
    ("dynamic_index_in_dim", "layer weights sliced out of the stack (scan)"),
)

BACKWARD_MARK = "transpose("
OTHER = "other"


@dataclasses.dataclass
class Breakdown:
    """Seconds per call of each labelled part, from a traced run of `calls` calls."""

    seconds: dict[str, float]  # label -> exclusive seconds per call (a label gets " (backward)" when it applies)
    wall_seconds: float  # untraced wall time per call (median)
    traced_wall_seconds: float  # wall time per call with the profiler on
    calls: int
    instructions: dict[str, float]  # top instructions: "module/instruction [label]" -> seconds per call

    @property
    def attributed_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def coverage(self) -> float:
        """Attributed instruction time over traced wall time (below 1: host gaps and untraced work)."""
        return self.attributed_seconds / self.traced_wall_seconds if self.traced_wall_seconds else 0.0

    def shares(self) -> dict[str, float]:
        total = self.attributed_seconds or 1.0
        return {k: v / total for k, v in self.seconds.items()}


def op_names(hlo_text: str) -> dict[str, str]:
    """instruction name -> op_name metadata, for every instruction of an HLO module's text."""
    names = {}
    for match in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name=\"([^\"]*)\"", hlo_text, re.MULTILINE):
        names[match.group(1)] = match.group(2)
    return names


def label_of(op_name: str, scopes: Sequence[tuple[str, str]] = MODEL_SCOPES) -> str:
    """The label of the first scope in `scopes` that `op_name` contains (as a path component or prefix of one)."""
    label = OTHER
    for scope, name in scopes:
        if re.search(r"(^|/|\()" + re.escape(scope) + r"($|/|\)|\.)", op_name):
            label = name
            break
    return label + (" (backward)" if BACKWARD_MARK in op_name else "")


def _trace_events(directory: str) -> list[dict]:
    files = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        raise RuntimeError(f"the profiler wrote no trace.json.gz under {directory}")
    with gzip.open(max(files, key=os.path.getmtime)) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def exclusive_times(events: Sequence[dict]) -> collections.Counter:
    """(module, instruction) -> summed exclusive microseconds of the trace's HLO-instruction events.

    An event nested in another on the same thread (a while loop's body inside the while) is
    subtracted from its parent, so nothing is counted twice.
    """
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    totals: collections.Counter = collections.Counter()
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[tuple[float, tuple[str, str]]] = []  # (end time, key) of the open events
        for e in thread_events:
            start, duration = e["ts"], e.get("dur", 0.0)
            while stack and stack[-1][0] <= start:
                stack.pop()
            key = (e["args"].get("hlo_module", ""), e["args"]["hlo_op"])
            totals[key] += duration
            if stack:
                totals[stack[-1][1]] -= duration
            stack.append((start + duration, key))
    return totals


def time_by_scope(
    compiled: Any,
    args: Sequence[Any],
    scopes: Sequence[tuple[str, str]] = MODEL_SCOPES,
    *,
    calls: int = 3,
    top: int = 12,
) -> Breakdown:
    """Times `compiled(*args)` untraced and traced, and attributes the traced instructions to `scopes`.

    Args:
      compiled: a compiled program (`jax.jit(f).lower(*args).compile()`); it must not donate `args`.
      args: its arguments.
      scopes: (scope, label) pairs; see `label_of`.
      calls: traced (and untraced) calls; the seconds are per call.
      top: how many of the costliest instructions to list in `Breakdown.instructions`.
    """
    jax.block_until_ready(compiled(*args))  # warm up outside the trace
    walls = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        walls.append(time.perf_counter() - start)
    names: dict[str, str] = {}
    for text in _hlo_texts(compiled):
        names.update(op_names(text))
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(compiled(*args))
        traced = (time.perf_counter() - start) / calls
        events = _trace_events(directory)
    totals = exclusive_times(events)
    if not totals:
        raise RuntimeError("the trace has no per-instruction events (hlo_op); this backend's profiler does not record them")
    seconds: collections.Counter = collections.Counter()
    per_instruction: collections.Counter = collections.Counter()
    for (module, instruction), microseconds in totals.items():
        label = label_of(names.get(instruction, ""), scopes)
        seconds[label] += microseconds / 1e6 / calls
        per_instruction[f"{module}/{instruction} [{label}]"] += microseconds / 1e6 / calls
    return Breakdown(
        seconds=dict(seconds.most_common()),
        wall_seconds=sorted(walls)[len(walls) // 2],
        traced_wall_seconds=traced,
        calls=calls,
        instructions=dict(per_instruction.most_common(top)),
    )


def _hlo_texts(compiled: Any) -> list[str]:
    """The optimized HLO text of a compiled program (one per module)."""
    text = compiled.as_text()
    return [text] if isinstance(text, str) else list(text)


def markdown(breakdown: Breakdown, *, title: str = "part") -> str:
    """A markdown table of the breakdown: label, seconds per call, share of the attributed time."""
    lines = [f"| {title} | ms per call | share |", "|---|---|---|"]
    for label, seconds in breakdown.seconds.items():
        lines.append(f"| {label} | {seconds * 1e3:.1f} | {seconds / (breakdown.attributed_seconds or 1):.1%} |")
    lines.append(f"| **all attributed instructions** (traced wall {breakdown.traced_wall_seconds * 1e3:.1f} ms, "
                 f"untraced {breakdown.wall_seconds * 1e3:.1f} ms) | **{breakdown.attributed_seconds * 1e3:.1f}** | "
                 f"{breakdown.coverage:.0%} of traced wall |")
    return "\n".join(lines)
