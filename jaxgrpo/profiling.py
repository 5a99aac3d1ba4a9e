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

The instructions' op_names come from the trace itself: the profiler stores each program's HLO (with its
metadata) in the trace's XSpace (`*.xplane.pb`), read here with a minimal protobuf reader, so any traced
run can be attributed, not only a program compiled for the purpose.

`StepTracer` does the same for whole training steps (`jaxgrpo-train --profile STEPS`): the loop
annotates its host phases (`phase("sample")`, ...), and `summarize_steps` reads the trace into a
`StepProfile`: seconds per step of each phase, of each compiled program and of each part of the model.
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


def _protobuf_fields(buffer: bytes):
    """(field number, value) of a serialized protobuf message: varints as ints, length-delimited fields as bytes."""
    def varint(i):
        value = shift = 0
        while True:
            byte = buffer[i]
            value |= (byte & 0x7F) << shift
            shift, i = shift + 7, i + 1
            if byte < 0x80:
                return value, i

    i = 0
    while i < len(buffer):
        key, i = varint(i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = varint(i)
        elif wire_type == 2:
            length, i = varint(i)
            value, i = buffer[i:i + length], i + length
        elif wire_type in (1, 5):  # fixed 64 and 32 bits
            size = 8 if wire_type == 1 else 4
            value, i = buffer[i:i + size], i + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, value


def _field(message: bytes, number: int) -> list:
    return [value for n, value in _protobuf_fields(message) if n == number]


def _text(message: bytes, number: int) -> str:
    values = _field(message, number)
    return values[0].decode() if values else ""


def xplane_op_names(xspace: bytes) -> dict[str, dict[str, str]]:
    """program (HLO module) name -> {instruction name: op_name} for every program whose HLO a trace stored.

    `xspace` is a serialized `tsl.profiler.XSpace` (a `*.xplane.pb`): its planes (field 1) carry event
    metadata (4: map entries of id 1 -> `XEventMetadata` 2) whose stats (5: `XStat`, metadata id 1, bytes 6)
    include "Hlo Proto": an `xla.HloProto` (module 1: name 1, computations 3: instructions 2: name 1,
    `OpMetadata` 7: op_name 2). Programs with the same name (one jit compiled for two shapes) are merged.
    """
    names: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for plane in _field(xspace, 1):
        stat_names = {}
        for entry in _field(plane, 5):  # map<int64, XStatMetadata>: id 1, name 2
            metadata = _field(entry, 2)[0]
            stat_names[(_field(metadata, 1) or [0])[0]] = _text(metadata, 2)
        hlo_stats = {i for i, name in stat_names.items() if name == "Hlo Proto"}
        if not hlo_stats:
            continue
        for entry in _field(plane, 4):
            for stat in _field(_field(entry, 2)[0], 5):
                if (_field(stat, 1) or [0])[0] not in hlo_stats:
                    continue
                module = _field(_field(stat, 6)[0], 1)[0]
                program = names[_text(module, 1)]
                for computation in _field(module, 3):
                    for instruction in _field(computation, 2):
                        metadata = _field(instruction, 7)
                        if metadata and (op_name := _text(metadata[0], 2)):
                            program[_text(instruction, 1)] = op_name
    return dict(names)


def label_of(op_name: str, scopes: Sequence[tuple[str, str]] = MODEL_SCOPES) -> str:
    """The label of the first scope in `scopes` that `op_name` contains (as a path component or prefix of one)."""
    label = OTHER
    for scope, name in scopes:
        if re.search(r"(^|/|\()" + re.escape(scope) + r"($|/|\)|\.)", op_name):
            label = name
            break
    return label + (" (backward)" if BACKWARD_MARK in op_name else "")


def _newest(directory: str, pattern: str) -> str:
    files = glob.glob(os.path.join(directory, "**", pattern), recursive=True)
    if not files:
        raise RuntimeError(f"the profiler wrote no {pattern} under {directory}")
    return max(files, key=os.path.getmtime)


def _trace_events(directory: str) -> list[dict]:
    with gzip.open(_newest(directory, "*.trace.json.gz")) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _trace_op_names(directory: str) -> dict[str, dict[str, str]]:
    with open(_newest(directory, "*.xplane.pb"), "rb") as f:
        return xplane_op_names(f.read())


#: Lines of a device's trace that summarize others or span waits (a program's or a step's span, the framework's
#: scopes, an asynchronous operation from its start to its end, counters), as the profiler names them: what an
#: accelerator ran is on its other lines (a GPU's streams, a TPU's "XLA Ops").
SUMMARY_LINES = frozenset({"XLA Modules", "Steps", "Framework Ops", "Framework Name Scope", "Source code",
                           "XLA TraceMe", "TensorFlow Ops", "TensorFlow Name Scope", "Async XLA Ops",
                           "Host Offload Ops", "Launch Stats", "Sparse Core Modules", "Sparse Core Steps",
                           "Sparse Core Syncs", "_counters_"})


def _device_events(events: Sequence[dict]) -> dict[int, list[dict]]:
    """The complete ("X") events of what each "/device:GPU:i" or "/device:TPU:i" process ran, by process id: its
    streams' kernels or cores' operations, not the lines that summarize them (`SUMMARY_LINES`), nor its "XLA Ops"
    line where the process has stream lines too (the same kernels grouped by instruction); empty for a trace
    without an accelerator (a CPU run)."""
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and str(e.get("args", {}).get("name", "")).startswith(("/device:GPU", "/device:TPU"))}
    lines = {(e["pid"], e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in devices}
    streams = {pid for (pid, _), name in lines.items() if name.startswith("Stream")}
    by_device: dict[int, list[dict]] = {pid: [] for pid in devices}
    for e in events:
        pid = e.get("pid")
        if e.get("ph") != "X" or pid not in by_device:
            continue
        line = lines.get((pid, e.get("tid")), "")
        if line not in SUMMARY_LINES and not (line == "XLA Ops" and pid in streams):
            by_device[pid].append(e)
    return by_device


def _busy_intervals(kernels: Sequence[dict]) -> list[tuple[float, float]]:
    """The union of the kernels' [start, end) intervals, in microseconds, in order."""
    union: list[tuple[float, float]] = []
    for start, stop in sorted((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in kernels):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], stop))
        else:
            union.append((start, stop))
    return union


def device_busy_seconds(directory: str) -> float | None:
    """Seconds some accelerator kernel ran in the trace in `directory`: the union of the intervals of the events
    on each "/device:GPU:i" or "/device:TPU:i" process (its streams or cores), summed over devices; None when
    the trace has no such process (a CPU run). Over the traced wall time it is the device's busy share."""
    kernels = device_kernels(directory)
    return None if kernels is None else kernels["busy_ms_per_step"] / 1e3


def device_kernels(directory: str, count: int = 1, top: int = 15, *,
                   events: Sequence[dict] | None = None) -> dict | None:
    """What the accelerator ran in the trace in `directory` (or its `events`, already read), per one of `count`
    steps (or calls): how many kernels and their summed time, the time some kernel ran (their union), the idle gaps
    between one kernel's end and the next one's start (how many, their median and total: launch and host latency
    where a step launches many short kernels), and the `top` kernels by time (by HLO instruction where the event
    names one, else by kernel name: time and launches per step). Over every device of the trace; None without one
    (a CPU run)."""
    by_device = _device_events(_trace_events(directory) if events is None else events)
    if not by_device:
        return None
    kernels = [e for events in by_device.values() for e in events]
    busy = [_busy_intervals(events) for events in by_device.values()]
    gaps = [later[0] - earlier[1] for union in busy for earlier, later in zip(union, union[1:])]
    by_name: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    for e in kernels:
        name = e.get("args", {}).get("hlo_op") or e.get("name", "")
        by_name[name] += e.get("dur", 0.0)
        launches[name] += 1
    per_step = lambda microseconds: microseconds / 1e3 / count  # noqa: E731  (milliseconds a step)
    return {
        "steps": count,
        "kernels_per_step": len(kernels) / count,
        "kernel_ms_per_step": per_step(sum(e.get("dur", 0.0) for e in kernels)),
        "busy_ms_per_step": per_step(sum(stop - start for union in busy for start, stop in union)),
        "gaps_per_step": len(gaps) / count,
        "gap_ms_per_step": per_step(sum(gaps)),
        "median_gap_us": sorted(gaps)[len(gaps) // 2] if gaps else 0.0,
        "top_kernels_ms_per_step": {name: per_step(us) for name, us in by_name.most_common(top)},
        "top_kernels_launches_per_step": {name: launches[name] / count for name, _ in by_name.most_common(top)},
    }


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


def _attribute(directory: str, events: Sequence[dict], scopes: Sequence[tuple[str, str]],
               count: int) -> tuple[collections.Counter, ...]:
    """(seconds per label, per program, per instruction), each over `count` calls or steps, of the trace in
    `directory` (its `events`): every instruction's exclusive time under the label of its op_name (`label_of`)."""
    totals = exclusive_times(events)
    if not totals:
        raise RuntimeError("the trace has no per-instruction events (hlo_op); this backend's profiler does not record them")
    names = _trace_op_names(directory)
    labels, programs, instructions = collections.Counter(), collections.Counter(), collections.Counter()
    for (module, instruction), microseconds in totals.items():
        label = label_of(names.get(module, {}).get(instruction, ""), scopes)
        seconds = microseconds / 1e6 / count
        labels[label] += seconds
        programs[module] += seconds
        instructions[f"{module}/{instruction} [{label}]"] += seconds
    return labels, programs, instructions


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
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        with jax.profiler.trace(directory):
            for _ in range(calls):
                jax.block_until_ready(compiled(*args))
        traced = (time.perf_counter() - start) / calls
        seconds, _, per_instruction = _attribute(directory, _trace_events(directory), scopes, calls)
    return Breakdown(
        seconds=dict(seconds.most_common()),
        wall_seconds=sorted(walls)[len(walls) // 2],
        traced_wall_seconds=traced,
        calls=calls,
        instructions=dict(per_instruction.most_common(top)),
    )


def markdown(breakdown: Breakdown, *, title: str = "part") -> str:
    """A markdown table of the breakdown: label, seconds per call, share of the attributed time."""
    lines = [f"| {title} | ms per call | share |", "|---|---|---|"]
    for label, seconds in breakdown.seconds.items():
        lines.append(f"| {label} | {seconds * 1e3:.1f} | {seconds / (breakdown.attributed_seconds or 1):.1%} |")
    lines.append(f"| **all attributed instructions** (traced wall {breakdown.traced_wall_seconds * 1e3:.1f} ms, "
                 f"untraced {breakdown.wall_seconds * 1e3:.1f} ms) | **{breakdown.attributed_seconds * 1e3:.1f}** | "
                 f"{breakdown.coverage:.0%} of traced wall |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Whole training steps: host phases, compiled programs and the model's parts.

#: Prefix of the loop's phase annotations in a trace.
PHASE_PREFIX = "jaxgrpo/"


def phase(name: str) -> jax.profiler.TraceAnnotation:
    """Marks a host phase of a step (`with phase("sample"): ...`) in any trace taken meanwhile; costs
    next to nothing when no trace is."""
    return jax.profiler.TraceAnnotation(PHASE_PREFIX + name)


@dataclasses.dataclass
class StepProfile:
    """Where traced training steps went, in seconds per step.

    phases: each host phase of the loop (`phase`): wall time, device work inside it included;
    programs: device time of each compiled program (HLO module), exclusive instruction time summed;
    parts: the same instructions under the model's scopes (`MODEL_SCOPES`);
    instructions: the costliest instructions, "program/instruction [part]";
    device: what the accelerator ran per step (`device_kernels`: launches, busy time, idle gaps between
      kernels), None on a CPU.
    """

    steps: tuple[int, int]  # first and last traced step, numbered as metrics.jsonl numbers them
    wall_seconds: float
    phases: dict[str, float]
    programs: dict[str, float]
    parts: dict[str, float]
    instructions: dict[str, float]
    device: dict | None = None

    @property
    def num_steps(self) -> int:
        return self.steps[1] - self.steps[0] + 1


def summarize_steps(directory: str, steps: tuple[int, int], wall_seconds: float, *,
                    scopes: Sequence[tuple[str, str]] = MODEL_SCOPES, top: int = 15) -> StepProfile:
    """The `StepProfile` of the trace in `directory`, which covers `steps` (first, last) in `wall_seconds`."""
    count = steps[1] - steps[0] + 1
    events = _trace_events(directory)
    phases: collections.Counter = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and name.startswith(PHASE_PREFIX):
            phases[name[len(PHASE_PREFIX):]] += event.get("dur", 0.0) / 1e6 / count
    parts, programs, instructions = _attribute(directory, events, scopes, count)
    return StepProfile(steps=steps, wall_seconds=wall_seconds / count, phases=dict(phases.most_common()),
                       programs=dict(programs.most_common()), parts=dict(parts.most_common()),
                       instructions=dict(instructions.most_common(top)),
                       device=device_kernels(directory, count, events=events))


def step_markdown(profile: StepProfile) -> str:
    """Three tables (host phases, compiled programs, the model's parts) and the costliest instructions."""
    wall = profile.wall_seconds or 1.0
    device = sum(profile.programs.values()) or 1.0
    first, last = profile.steps
    phases = {**profile.phases, "(outside the phases)": max(0.0, profile.wall_seconds - sum(profile.phases.values()))}
    programs = {name: s for name, s in profile.programs.items() if s >= 0.01 * device}
    if len(programs) < len(profile.programs):  # the many small programs of eager host-side work, summed
        rest = {name: s for name, s in profile.programs.items() if name not in programs}
        programs[f"({len(rest)} programs under 1% each)"] = sum(rest.values())
    lines = [f"# Steps {first}-{last}: {profile.wall_seconds:.3f} s per step (traced)", "",
             "| host phase | s per step | share of the step |", "|---|---|---|"]
    lines += [f"| {name} | {s:.3f} | {s / wall:.1%} |" for name, s in phases.items()]
    lines += ["", "| compiled program | device s per step | share of device time |", "|---|---|---|"]
    lines += [f"| {name} | {s:.3f} | {s / device:.1%} |" for name, s in programs.items()]
    lines += ["", "| part of the model | device s per step | share of device time |", "|---|---|---|"]
    lines += [f"| {name} | {s:.3f} | {s / device:.1%} |" for name, s in profile.parts.items()]
    lines += ["", "| costliest instructions | device s per step |", "|---|---|"]
    lines += [f"| `{name}` | {s:.4f} |" for name, s in profile.instructions.items()]
    if profile.device:  # an accelerator: is it busy, or waiting between many short kernels?
        d = profile.device
        lines += ["", f"The accelerator ran {d['kernels_per_step']:.0f} kernels a step "
                  f"({d['kernel_ms_per_step']:.1f} ms of kernel time), busy {d['busy_ms_per_step']:.1f} ms of the step's "
                  f"{profile.wall_seconds * 1e3:.1f} ({d['busy_ms_per_step'] / 1e3 / wall:.0%}); between kernels it "
                  f"waited {d['gaps_per_step']:.0f} times, {d['gap_ms_per_step']:.1f} ms in all (median gap "
                  f"{d['median_gap_us']:.1f} us)."]
    return "\n".join(lines) + "\n"


class StepTracer:
    """Traces `count` consecutive steps from `first` (numbered as metrics.jsonl numbers them) into
    `directory/steps_<first>-<last>/`, and writes there `summary.md` and `summary.json` (a `StepProfile`).

    The loop calls `begin(step)` before each step and `end(step)` after it; `end` returns the summary's path
    after the last traced step. `write` False (the processes other than 0 of a multi-host run) traces without
    summarizing. `close` stops a trace left open by an exception.
    """

    def __init__(self, directory: str, first: int, count: int, *, write: bool = True):
        self.first, self.last = first, first + count - 1
        self.directory = os.path.join(directory, f"steps_{self.first}-{self.last}")
        self.write = write
        self._start: float | None = None

    def begin(self, step: int) -> None:
        if step == self.first:
            os.makedirs(self.directory, exist_ok=True)
            jax.profiler.start_trace(self.directory)  # its trace.json.gz opens in Perfetto as it is
            self._start = time.perf_counter()

    def end(self, step: int) -> str | None:
        if step != self.last or self._start is None:
            return None
        wall = time.perf_counter() - self._start
        self.close()
        if not self.write:
            return None
        profile = summarize_steps(self.directory, (self.first, self.last), wall)
        path = os.path.join(self.directory, "summary.md")
        with open(path, "w") as f:
            f.write(step_markdown(profile))
        with open(os.path.join(self.directory, "summary.json"), "w") as f:
            json.dump(dataclasses.asdict(profile), f, indent=1)
        return path

    def close(self) -> None:
        if self._start is not None:
            self._start = None
            jax.profiler.stop_trace()
