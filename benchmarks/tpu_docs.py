"""Renders docs/tpu.md from the committed compile reports in docs/tpu/*.json.

    python benchmarks/tpu_docs.py            # writes docs/tpu.md
    python benchmarks/tpu_docs.py --check    # exits 1 if docs/tpu.md is stale
    python benchmarks/tpu_docs.py --retrace  # adds the memory-bound estimates to the reports, then writes

Each report is what `jaxgrpo-compile EXPERIMENT --topology T --json docs/tpu/NAME.json` wrote, plus the
keys `experiment` (the file compiled), `overrides` and `load_average` (this machine's 1-minute load when it
compiled) that `--record` below adds. The page is a pure function of those files: nothing is compiled
here, so the staleness test is cheap; recompiling is how the reports themselves are refreshed:

    python benchmarks/tpu_docs.py --record experiments/tpu/qwen3_4b_gsm8k_v5e_8.py v5e:2x4

`--retrace` traces each report's update and forward again (no compilation: seconds each) to add the roofline
estimate with the memory-bound work (`compile.count_products`' `memory_bound_*`) to reports compiled before the
report had it (or to count it again), where the products' estimate of the new trace equals the report's (within
1%: the same program).
The page's calibration (how far measured runs were from the estimates) is `jaxgrpo.tools.calibration`'s committed rows
and the device-check results in benchmarks/results/device_check_*.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(ROOT, "docs", "tpu")
RESULTS = os.path.join(ROOT, "benchmarks", "results")  # device-check results (`jaxgrpo.tools.calibration.load`)
DOC_PATH = os.path.join(ROOT, "docs", "tpu.md")
COMMAND = "python benchmarks/tpu_docs.py"
GiB = 1 << 30

#: The benchmark goals: (model, topology) pairs that must fit at the recipes' shapes.
FIT_GOALS = (("qwen3-4b", "v5e:2x4"), ("qwen3-8b", "v5p:2x2x1"), ("qwen3-14b", "v5p:2x2x2"))
MFU_GOAL = 0.5
DECODE_GOAL = 1.3  # decode step / its HBM floor
#: Splash against the XLA form: the update's estimated time at T = 4096 (Qwen3-1.7B, v5e-8), at most this ratio.
SPLASH_GOAL = 0.8
SPLASH_VS_XLA = ("qwen3_1_7b_v5e_8_t4k_pallas_tpu", "qwen3_1_7b_v5e_8_t4k_xla")
COMPILE_GOAL_SECONDS = 120.0  # the 8B update on this 2-core machine
#: Long sequences with splash attention (one row per chip per micro-batch): reports that must fit.
LONG_FIT_GOALS = (("Qwen3-1.7B GRPO at T = 32k fits a v5e-8", "qwen3_1_7b_v5e_8_t32k_pallas_tpu"),
                  ("Qwen3-8B GRPO at T = 16k fits a v5p-8", "qwen3_8b_v5p_8_t16k_pallas_tpu"))
#: Qwen3-1.7B's update temporaries with splash at T = 2k, 8k, 16k, 32k: linear in T, not quadratic.
LINEAR_SWEEP = tuple(f"qwen3_1_7b_v5e_8_t{t}_pallas_tpu" for t in ("2k", "8k", "16k", "32k"))
#: LoRA and QLoRA at the recipes' shapes (issue 35): reports that must fit, each beside the full fine-tune of the
#: same model and topology (the same recipe compiled with `--set lora=none`).
LORA_FIT_GOALS = (("Qwen3-8B GRPO with LoRA fits a v5e-8", "qwen3_8b_lora_gsm8k_v5e_8"),
                  ("Qwen3-8B GRPO with QLoRA nf4 fits a v5e-8", "qwen3_8b_lora_gsm8k_v5e_8_nf4"))
#: How a LoRA recipe is compiled as a full fine-tune of the same model, for comparison.
FULL_FINE_TUNE = "lora=none"


def load_reports(directory: str = REPORTS) -> list[dict]:
    reports = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            report = json.load(f)
        report["name"] = os.path.basename(path)[:-5]
        if "peer" not in report:
            reports.append(report)
    return reports


def micro_batches(report: dict) -> int:
    """Micro-batches per update of the experiment a report compiled."""
    from jaxgrpo.config import apply_overrides, load_experiment

    cfg = load_experiment(os.path.join(ROOT, report["experiment"]))
    apply_overrides(cfg, list(report.get("overrides") or []))
    minibatch = cfg.batch_size // cfg.num_minibatches
    return minibatch // (cfg.micro_batch_size or minibatch)


def load_peers(directory: str = REPORTS) -> list[dict]:
    """The peers' compile reports (`benchmarks/peer_tunix_compile.py --json`), saved as docs/tpu/peer_*.json."""
    peers = []
    for path in sorted(glob.glob(os.path.join(directory, "peer_*.json"))):
        with open(path) as f:
            peers.append(json.load(f))
    return peers


#: tunix's model constructors by jaxgrpo's architecture names.
PEER_MODELS = {"qwen3_0p6b": "qwen3-0.6b", "qwen3_1p7b": "qwen3-1.7b", "qwen3_4b": "qwen3-4b", "qwen3_8b": "qwen3-8b",
               "qwen3_14b": "qwen3-14b"}


def peers(reports: list[dict], peer_reports: list[dict]) -> list[str]:
    lines = ["| peer | model | topology | peer: HBM per chip, products' roofline per micro-batch | jaxgrpo: the same "
             "| ratio ours / peer (time, HBM) |", "|---|---|---|---|---|---|"]
    for peer in peer_reports:
        model = PEER_MODELS.get(peer["model"], peer["model"])
        ours = next((r for r in reports if r["model"] == model and r["topology"] == peer["topology"]
                     and label(r) == r["model"]), None)
        theirs = peer["program"]
        update = None if ours is None else _program(ours, "update")
        if update is None or update.get("error") or theirs.get("error"):
            ratio, mine = "-", "not compiled" if update is None else "does not fit"
        else:
            per_micro = update["estimated_seconds"] / micro_batches(ours)
            mine = f"{update['hbm_bytes'] / GiB:.2f} GiB, {per_micro * 1e3:.0f} ms"
            ratio = f"{per_micro / theirs['estimated_seconds']:.2f}, {update['hbm_bytes'] / theirs['hbm_bytes']:.2f}"
        them = "does not fit: " + theirs["error"] if theirs.get("error") else \
            f"{theirs['hbm_bytes'] / GiB:.2f} GiB, {theirs['estimated_seconds'] * 1e3:.0f} ms"
        lines.append(f"| {peer['peer']} | {model} | {peer['topology']} | {them} | {mine} | {ratio} |")
    return lines


def _program(report: dict, name: str) -> dict | None:
    return next((p for p in report["programs"] if p["program"] == name), None)


def training(report: dict) -> str:
    """What a report's programs train: "LoRA r16", "QLoRA nf4 r16", or "full" (every parameter)."""
    lora = report.get("lora")
    if not lora:
        return "full"
    return (f"QLoRA {lora['quantize_base']}" if lora.get("quantize_base") else "LoRA") + f" r{lora['rank']}"


def label(report: dict) -> str:
    """The model, with what it trains if not every parameter, and what the report changed from its recipe
    (overrides other than LoRA's, the CPU forms); a LoRA recipe compiled with `lora=none` is a "full fine-tune"."""
    overrides = [o for o in report.get("overrides") or [] if not o.startswith("lora")]
    changes = (["full fine-tune"] if FULL_FINE_TUNE in (report.get("overrides") or []) else []) + overrides + (
        ["CPU forms"] if report.get("cpu_forms") else [])
    trains = "" if training(report) == "full" else f" + {training(report)}"
    return report["model"] + trains + (f" ({', '.join(changes)})" if changes else "")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def attention(report: dict) -> str:
    """The attention implementation a report's programs were traced with (reports before the field
    existed say it in their JSON by hand: the recipes compiled before `pallas_tpu` was the default)."""
    return report.get("attention", "?")


def _pallas_ms(report: dict, program: dict) -> str:
    """The Pallas calls' part of the products' roofline: "-" for a program without any, "not counted" for a
    splash report compiled before `count_products` counted them."""
    if program.get("pallas_seconds"):
        return _ms(program["pallas_seconds"])
    return "not counted" if attention(report) != "xla" and "pallas_seconds" not in program else "-"


def _largest(program: dict) -> str:
    values = program.get("largest_values") or []
    return "; ".join(f"`{v['shape']}` {v['bytes'] / GiB:.2f} GiB ({v['op'].split('/')[-2] if '/' in v['op'] else v['op']})"
                     for v in values[:2]) or "-"


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _with_memory(program: dict) -> str:
    """The roofline estimate with the memory-bound work, "-" where the report has none (`--retrace` adds it)."""
    return _ms(program.get("estimated_seconds_with_memory") or None)


def engine_report(report: dict) -> bool:
    """A report of the rollout engine's programs alone (`--programs engine`, named NAME_engine)."""
    return bool(report["programs"]) and all(p["program"].startswith("engine") for p in report["programs"])


def program_label(report: dict, program: dict) -> str:
    """A program's name, and for the engine's on a slice of several hosts whose it is: one host's engine, on that
    host's chips (a run has one per host)."""
    name = program["program"]
    if name.startswith("engine") and report["hosts"] > 1:
        name += f" (a host's: {report['chips'] // report['hosts']} chips)"
    return name


def table(reports: list[dict]) -> list[str]:
    lines = [
        "| model | topology | attention | program | fits | HBM per chip (GiB) | compiler estimate, loop bodies once (ms) "
        "| products' roofline estimate, loops x trips (ms) | of which Pallas calls (ms) "
        "| roofline estimate with memory-bound work (ms) | estimated MFU (roofline bound): products / with memory "
        "| decode step / HBM floor | compiled in (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        for p in r["programs"]:
            decode = "-"
            if p.get("step_floor_seconds"):
                decode = f"{p['estimated_seconds'] * 1e3:.2f} / {p['step_floor_seconds'] * 1e3:.2f} ms = " \
                         f"{p['estimated_seconds'] / p['step_floor_seconds']:.2f}x"
            mfu = "-" if p.get("mfu") is None else f"{_percent(p['mfu'])} / {_percent(p.get('mfu_with_memory'))}"
            lines.append(
                f"| {label(r)} | {r['topology']} ({r['chips']} chips, {r['hosts']} host{'s' * (r['hosts'] > 1)}) "
                f"| {attention(r)} | {program_label(r, p)} | {'yes' if p['fits'] else '**no**'} "
                f"| {p['hbm_bytes'] / GiB:.2f} of {p['hbm_capacity'] / GiB:.0f} | {_ms(p['compiler_seconds'])} "
                f"| {_ms(p['estimated_seconds'])} | {_pallas_ms(r, p)} | {_with_memory(p)} | {mfu} | {decode} "
                f"| {p['compile_seconds']:.0f} |")
    return lines


def calibration_rows() -> list:
    """The measured runs: `jaxgrpo.tools.calibration`'s committed rows and benchmarks/results/device_check_*.json."""
    from jaxgrpo.tools import calibration

    return calibration.load([RESULTS])


def calibration_table(rows: list) -> list[str]:
    lines = ["| chip | jax | program | configuration | date | measured (s) | products' roofline estimate (s) "
             "| measured / estimate | estimate with memory-bound work (s) | measured / that estimate | how obtained |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        with_memory = row.estimate_with_memory_seconds
        lines.append(f"| {row.chip} | {row.jax_version} | {row.program} | {row.configuration} | {row.date} "
                     f"| {row.measured_seconds:.2f} | {row.estimate_seconds:.3f} | {row.factor:.1f}x "
                     f"| {'-' if with_memory is None else format(with_memory, '.3f')} "
                     f"| {'-' if with_memory is None else format(row.factor_with_memory, '.1f') + 'x'} "
                     f"| {os.path.relpath(row.source, ROOT) if os.path.isabs(row.source) else row.source} |")
    return lines


def calibration_text(rows: list) -> list[str]:
    """The paragraph stating how far the measured runs were from their estimates, and that no TPU has run."""
    from jaxgrpo.tools import calibration

    off = calibration.nearest(rows, "TPU", "update", packing=False)
    on = calibration.nearest(rows, "TPU", "update", packing=True)
    tpu_runs = [row for row in rows if row.platform == "tpu"]
    lines = [
        "Nothing on this page ran on a TPU: its times and estimated MFU are roofline bounds, what the chips'",
        "published peak and bandwidth allow, and a real run is slower. How much slower was measured on a GPU:",
        "",
    ]
    for row in (off, on):
        if row is None:
            continue
        memory = "" if row.factor_with_memory is None else (
            f", and {row.factor_with_memory:.1f}x its roofline estimate with the memory-bound work "
            f"({row.estimate_with_memory_seconds:.2f} s)")
        lines.append(f"* {row.configuration}, on one {row.chip} with jax {row.jax_version}: the update took "
                     f"{row.measured_seconds:.2f} s, {row.factor:.1f}x its products' roofline estimate "
                     f"({row.estimate_seconds:.3f} s){memory}.")
    lines += [
        "",
        *(["No TPU run has been measured yet, so the factors above come from a GPU, and `jaxgrpo-compile` prints",
           "them beside each TPU estimate labelled as a GPU's."] if not tpu_runs else
          [f"TPU runs measured: {len(tpu_runs)} (in the table below); `jaxgrpo-compile` prints the nearest one's",
           "factor beside each estimate."]),
        "The products' estimate leaves out the element-wise work, reductions, transposes and slices over the big",
        "arrays, which a GPU runs at memory bandwidth: counted as the bytes their results write (a fusion's",
        "intermediates never reach memory), that work closes most of the gap. A TPU fuses differently and its",
        "matrix units may reach a different share of their peak; until a TPU run is measured (add it as a",
        "`benchmarks/results/device_check_*.json`, `jaxgrpo/tools/calibration.py` says what it holds), read every",
        "estimated MFU here as an upper bound.",
        "",
        *calibration_table(rows),
    ]
    return lines


def _calibration_note(report: dict, rows: list) -> str:
    """What the nearest measured run reached of its estimated MFU (`jaxgrpo.tools.calibration.nearest`)."""
    from jaxgrpo.tools import calibration

    row = calibration.nearest(rows, report["chip"], "update", _packing(report))
    if row is None:
        return "no measured run to calibrate against"
    return f"a measured update reached 1/{row.factor:.1f} of its estimate ({calibration.provenance(row, report['chip'])})"


def _packing(report: dict) -> bool:
    """Whether the report's experiment trains on packed rows (its overrides applied)."""
    from jaxgrpo.config import apply_overrides, load_experiment

    cfg = load_experiment(os.path.join(ROOT, report["experiment"]))
    apply_overrides(cfg, list(report.get("overrides") or []))
    return cfg.packing


def goals(reports: list[dict], calibrations: list | None = None) -> list[str]:
    calibrations = calibration_rows() if calibrations is None else calibrations
    as_recipe = [r for r in reports if label(r) == r["model"] and not engine_report(r)]
    by_model = {(r["model"], r["topology"]): r for r in as_recipe}
    lines = ["| goal | from the compile reports (times and estimated MFU: roofline bounds) | met |", "|---|---|---|"]
    by_name = {r["name"]: r for r in reports}
    splash, dense = (by_name.get(name) for name in SPLASH_VS_XLA)
    if splash is None or dense is None:
        lines.append(f"| Qwen3-1.7B update at T = 4096 on a v5e-8: splash / XLA estimated time <= {SPLASH_GOAL}x | "
                     "not compiled | no |")
    else:
        ours, theirs = _program(splash, "update"), _program(dense, "update")
        ratio = ours["estimated_seconds"] / theirs["estimated_seconds"]
        lines.append(f"| Qwen3-1.7B update at T = 4096 on a v5e-8: splash / XLA estimated time <= {SPLASH_GOAL}x "
                     f"(Pallas calls at their analytic cost) | {ours['estimated_seconds']:.2f} s (Pallas "
                     f"{ours['pallas_seconds']:.2f}) / {theirs['estimated_seconds']:.2f} s = {ratio:.2f}x | "
                     f"{'yes' if ratio <= SPLASH_GOAL else 'no'} |")
    lines += _long_sequence_goals(by_name)
    lines += _lora_goals(by_name)
    for model, topology in FIT_GOALS:
        r = by_model.get((model, topology))
        if r is None:
            lines.append(f"| {model} fits {topology} | not compiled | no |")
            continue
        worst = max(r["programs"], key=lambda p: p["hbm_bytes"] / p["hbm_capacity"])
        fits = all(p["fits"] for p in r["programs"])
        lines.append(f"| {model} fits {topology} (16 x 8 rows, 512 + 1024 tokens) | largest: {worst['program']} "
                     f"{worst['hbm_bytes'] / GiB:.2f} of {worst['hbm_capacity'] / GiB:.0f} GiB | "
                     f"{'yes' if fits else 'no, by ' + format((worst['hbm_bytes'] - worst['hbm_capacity']) / GiB, '.2f') + ' GiB'} |")
    for r in as_recipe:
        update = _program(r, "update")
        if update is not None and update.get("mfu") is not None:
            mfu = update["mfu"]
            verdict = "yes, by the estimate" if mfu >= MFU_GOAL else f"no, {MFU_GOAL / mfu:.2f}x short"
            lines.append(f"| {r['model']} on {r['topology']}: update estimated MFU (roofline bound) >= {MFU_GOAL:.0%} | "
                         f"{mfu:.0%}; {_calibration_note(r, calibrations)} | {verdict} |")
        if r["model"] == "qwen3-8b" and update is not None:
            load = r.get("load_average")
            met = update["compile_seconds"] <= COMPILE_GOAL_SECONDS
            lines.append(f"| compiling the 8B update <= {COMPILE_GOAL_SECONDS:.0f} s on this 2-core machine | "
                         f"{update['compile_seconds']:.0f} s (1-minute load average {load} while it compiled) | "
                         f"{'yes' if met else 'no, ' + format(update['compile_seconds'] / COMPILE_GOAL_SECONDS, '.1f') + 'x'} |")
    lines += _engine_goals([r for r in reports if engine_report(r) and not r.get("cpu_forms")])
    return lines


def _engine_goals(reports: list[dict]) -> list[str]:
    """The rollout engine's decode step against its HBM floor with the paged kernel, its pool full (the costliest
    step), per recipe: one host's engine, its slots that host's share of the step's 128 rows."""
    lines = []
    for r in reports:
        full = _program(r, "engine decode 100% full")
        if full is None or not full.get("step_floor_seconds"):
            continue
        ratio = full["estimated_seconds"] / full["step_floor_seconds"]
        host = f"one host's engine, {128 // r['hosts']} slots" if r["hosts"] > 1 else "128 slots"
        lines.append(f"| {label(r)} on {r['topology']}: the engine's decode step ({host}, pool full) <= {DECODE_GOAL}x its "
                     f"HBM floor (attention {attention(r)}: the paged kernel) | {full['estimated_seconds'] * 1e3:.2f} / "
                     f"{full['step_floor_seconds'] * 1e3:.2f} ms = {ratio:.2f}x | {'yes' if ratio <= DECODE_GOAL else 'no'} |")
    return lines


def _tokens(report: dict) -> int:
    """Tokens per row of a report's update: prompt + completion (its overrides, else the recipe's)."""
    from jaxgrpo.config import apply_overrides, load_experiment

    cfg = load_experiment(os.path.join(ROOT, report["experiment"]))
    apply_overrides(cfg, list(report.get("overrides") or []))
    return cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens


def _long_sequence_goals(by_name: dict[str, dict]) -> list[str]:
    """The long-sequence rows: the T-sweep's temporaries linear in T (each doubling of T at most doubles
    the growth: the largest step's increment per token within 1.5x of the smallest's), and the fits."""
    lines = []
    sweep = [by_name.get(name) for name in LINEAR_SWEEP]
    if any(r is None for r in sweep):
        lines.append("| Qwen3-1.7B update temporaries linear in T (2k..32k, splash) | not compiled | no |")
    else:
        points = [(_tokens(r), _program(r, "update")["temp_bytes"]) for r in sweep]
        slopes = [(b1 - b0) / (t1 - t0) for (t0, b0), (t1, b1) in zip(points, points[1:])]
        linear = max(slopes) <= 1.5 * min(slopes)
        shown = ", ".join(f"{b / GiB:.2f}" for _, b in points)
        lines.append(f"| Qwen3-1.7B update temporaries linear in T on a v5e-8 (splash; T = "
                     f"{', '.join(str(t) for t, _ in points)}) | {shown} GiB; {min(slopes) * 1024 / GiB:.2f}-"
                     f"{max(slopes) * 1024 / GiB:.2f} GiB per 1k tokens | {'yes' if linear else 'no'} |")
    for goal, name in LONG_FIT_GOALS:
        r = by_name.get(name)
        if r is None:
            lines.append(f"| {goal} | not compiled | no |")
            continue
        p = _program(r, "update")
        lines.append(f"| {goal} (update, {attention(r)}) | {p['hbm_bytes'] / GiB:.2f} of {p['hbm_capacity'] / GiB:.0f} "
                     f"GiB per chip | {'yes' if p['fits'] else 'no'} |")
    return lines


def _full_fine_tune_of(report: dict, reports: list[dict]) -> dict | None:
    """The report of `report`'s recipe compiled as a full fine-tune (`--set lora=none`), if there is one."""
    return next((r for r in reports if r.get("experiment") == report.get("experiment")
                 and FULL_FINE_TUNE in (r.get("overrides") or [])), None)


def _lora_goals(by_name: dict[str, dict]) -> list[str]:
    lines = []
    for goal, name in LORA_FIT_GOALS:
        r = by_name.get(name)
        if r is None:
            lines.append(f"| {goal} (16 x 8 rows, 512 + 1024 tokens) | not compiled | no |")
            continue
        worst = max(r["programs"], key=lambda p: p["hbm_bytes"] / p["hbm_capacity"])
        full = _full_fine_tune_of(r, list(by_name.values()))
        full_update = None if full is None else _program(full, "update")
        beside = "" if full_update is None else f"; the full fine-tune's update {full_update['hbm_bytes'] / GiB:.2f}"
        fits = all(p["fits"] for p in r["programs"])
        lines.append(f"| {goal} (16 x 8 rows, 512 + 1024 tokens) | largest: {worst['program']} "
                     f"{worst['hbm_bytes'] / GiB:.2f} of {worst['hbm_capacity'] / GiB:.0f} GiB{beside} | "
                     f"{'yes' if fits else 'no'} |")
    return lines


def lora_table(reports: list[dict]) -> list[str]:
    """Per chip, each LoRA recipe's programs beside its full fine-tune: what trains, what the update holds."""
    lines = ["| model | topology | trains | parameters trained | update: HBM per chip (GiB) | of which arguments "
             "| of which temporaries | KL reference's copy per chip (GiB) | engine decode, pool full: HBM per chip (GiB) "
             "| update fits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    compared = [r for r in reports if not engine_report(r)
                and (r.get("lora") or FULL_FINE_TUNE in (r.get("overrides") or []))]
    # Per model and topology: the full fine-tune, then LoRA, then QLoRA.
    compared.sort(key=lambda r: (r["model"], r["topology"], bool(r.get("lora")),
                                 bool((r.get("lora") or {}).get("quantize_base"))))
    for r in compared:
        update, engine = _program(r, "update"), _engine_of(r, reports)
        decode = engine and _program(engine, "engine decode 100% full")
        trained = r.get("num_trained") or r["num_params"]
        cells = ["-"] * 4 if update is None else [
            f"{update['hbm_bytes'] / GiB:.2f} of {update['hbm_capacity'] / GiB:.0f}",
            f"{update['argument_bytes'] / GiB:.2f}", f"{update['temp_bytes'] / GiB:.2f}",
            "yes" if update["fits"] else "**no**"]
        lines.append(f"| {r['model']} | {r['topology']} | {training(r)} | {trained / 1e6:,.1f}M of "
                     f"{r['num_params'] / 1e6:,.1f}M | {cells[0]} | {cells[1]} | {cells[2]} | {_reference_copy(r)} | "
                     f"{'-' if decode is None else format(decode['hbm_bytes'] / GiB, '.2f')} | {cells[3]} |")
    return lines


def _engine_of(report: dict, reports: list[dict]) -> dict | None:
    """The engine report (`--programs engine`) of `report`'s recipe: its experiment, topology and overrides."""
    return next((r for r in reports if engine_report(r) and not r.get("cpu_forms")
                 and r.get("experiment") == report.get("experiment") and r["topology"] == report["topology"]
                 and (r.get("overrides") or []) == (report.get("overrides") or [])), None)


def _reference_copy(report: dict) -> str:
    """The bytes per chip of the KL reference's own copy of the weights, which a full fine-tune with a KL term keeps
    in HBM beside the update's state (an input of the reference forward, not of the update, so not in its figure);
    a LoRA run has none: its reference is the base with the adapters off."""
    from jaxgrpo.config import apply_overrides, load_experiment

    cfg = load_experiment(os.path.join(ROOT, report["experiment"]))
    apply_overrides(cfg, list(report.get("overrides") or []))
    if not cfg.kl_coef:
        return "none (no KL term)"
    if cfg.lora is not None:
        return "none (the base, adapters off)"
    itemsize = {"bfloat16": 2, "float32": 4}[cfg.dtype]
    return f"{report['num_params'] * itemsize / report['chips'] / GiB:.2f}"


def causes(reports: list[dict]) -> list[str]:
    lines = ["| model | topology | program | largest values the compiled program computes | collectives (count, MiB) |",
             "|---|---|---|---|---|"]
    for r in reports:
        for p in r["programs"]:
            moved = ", ".join(f"{k} {v['count']} ({v['bytes'] / 2**20:.0f})" for k, v in p["collectives"].items()
                              if v["count"]) or "none"
            lines.append(f"| {label(r)} | {r['topology']} | {p['program']} | {_largest(p)} | {moved} |")
    return lines


def render(directory: str = REPORTS) -> str:
    reports = load_reports(directory)
    calibrations = calibration_rows()
    out = [
        "# Compiled for TPU pods, without a TPU",
        "",
        f"Generated by `{COMMAND}` from the compile reports in `docs/tpu/*.json`; do not edit by hand.",
        "",
        "Each recipe in `experiments/tpu/` is compiled here, on a CPU-only machine, by libtpu for the TPU slice",
        "it is sized for (`jaxgrpo-compile`, see `jaxgrpo/tools/compile/`): the rollout engine's prefill and decode",
        "(16 prompts x 8 samples = 128 rows; the *engine* rows) and the update (one optimizer step over a minibatch",
        "of 64 rows in micro-batches of 16, 512 prompt + 1024 completion tokens). No weights are read and nothing runs, so",
        "every time below is an estimate, a roofline bound, and so is the estimated MFU each implies (how far",
        "real runs were from them: *Measured against the estimates* below):",
        "",
        "* *compiler estimate*: XLA's own cost model, which counts each loop body once (the layer scan, the",
        "  micro-batch scan, the decode loop), so it is far below the real time, or absent (negative) for loops;",
        "* *products' roofline estimate*: the traced program's matrix products with every scan body times its length",
        "  (remat's recomputation and attention included), each at max(FLOPs / peak, bytes / HBM bandwidth),",
        "  a chip doing its share of each; collectives and element-wise work are not in it. Pallas calls are",
        "  in it at the cost they state (`cost_estimate`), apart in *of which Pallas calls*: splash attention",
        "  at the blocks its mask visits (causal: 36 of 64 blocks of 512 at T = 4096), 2 products per block",
        "  forward and 3 + 4 backward (`pallas_tpu.splash_cost_estimates`); the decode kernel at a full cache",
        "  (`pallas_decode.full_cache_cost_estimate`), over a paged pool at most the pool's positions",
        "  (`pallas_decode.paged_cost_estimate`). *not counted*: compiled before they were counted;",
        "* *roofline estimate with memory-bound work*: that, plus the bytes the other operations over big arrays",
        "  (element-wise, reductions, transposes, gathers, slices; each result of at least 1 MiB written once)",
        "  move at HBM bandwidth (`compile.memory_bound_bytes_of`); traced again for the update and forward of the",
        "  reports compiled before it was counted (`--retrace`), `-` where the products' estimate of the new",
        "  trace differs from the report's;",
        "* *attention*: the implementation the programs were traced with: `xla` rows either ask for it",
        "  (`attention=xla`); the XLA form has dense `[T, T]` scores;",
        "* *estimated MFU (roofline bound)*: the model's 6·N FLOPs per trained token (2·N forward; N the parameters a",
        "  token multiplies by, not an untied input embedding, which is a lookup) over chips x peak x the products'",
        "  estimate, then x the estimate with memory-bound work; an upper bound on a real run's;",
        "* *decode step / HBM floor*: one decode step's products' roofline against the bytes a chip must read",
        "  per token (its parameters and the whole KV cache) at its HBM bandwidth. Under FSDP a decode step",
        "  also all-gathers every layer's weights (the `all-gather` bytes below), which neither figure counts;",
        "* *engine* rows (`--programs engine`, reports named `*_engine`): the rollout engine's prefill and one decode",
        "  step of a chunk with its paged KV pool half and wholly full (a slot per sample, 16-position blocks),",
        "  the decode reading the blocks in place with the paged kernel; its floor is the parameters and the pool",
        "  a chip holds. On a slice of several hosts a run has one engine per host, on that host's chips with its",
        "  share of the rows and its copy of the weights split over them: that is what is compiled (*a host's*).",
        "  The recipes sample through the engine (since 2026-12-06 the trainer's only sampler; the reports' decode",
        "  programs of the fixed-batch sampler before it were dropped when the updates were compiled again, 2026-12-07).",
        "",
        "## Reports",
        "",
        *table(reports),
        "",
        "## Benchmark goals",
        "",
        *goals(reports, calibrations),
        "",
        "## Measured against the estimates",
        "",
        *calibration_text(calibrations),
        "",
        "## LoRA and QLoRA",
        "",
        "A LoRA recipe trains rank-r adapters on every projection (`Config.lora`, docs/lora.md): the update's",
        "arguments are the read-only base (in bfloat16, or in 4-bit NormalFloat with `lora.quantize_base=nf4`),",
        "the adapters and their Adam moments; the base gets no gradient and no optimizer state. Each is shown",
        "beside the same recipe compiled as a full fine-tune (`--set lora=none`), whose KL term also keeps a",
        "reference copy of the weights in HBM (an input of the reference forward, so not in the update's figure);",
        "with LoRA the reference is the base with the adapters off. The estimated MFU of a LoRA update counts 4·N FLOPs",
        "per token for the frozen weights (no weight gradient) and 6 per adapter parameter.",
        "",
        *lora_table(reports),
        "",
        "## What the compiled programs hold and move",
        "",
        "The largest arrays each compiled program computes (from its HLO: a `[B, kv, G, T, T]` float32 value",
        "is the dense attention scores of one layer), and the collectives in its HLO text (a collective",
        "inside the layer loop is listed once, and runs once per layer).",
        "",
        *causes(reports),
        "",
        "## Findings",
        "",
        "* **The backward pass multiplied in float32.** Each projection returned a float32 product that the layer",
        "  cast to bfloat16; differentiating the cast gave float32 cotangents, so every backward product took two",
        "  float32 operands (converted in HBM-sized fusions). The accelerators' memory forms now return products in",
        "  the model's dtype (`memory_forms.product_in_dtype`; the GEMM still accumulates in float32 and rounds",
        "  once), and every report here was recompiled with it (2026-12-07): with the memory-bound work, Qwen3-1.7B's",
        "  update on a v5e-8 from 1.57 to 1.48 s (3.66 to 3.46 GiB per chip), Qwen3-4B's from 3.35 to 3.18 s,",
        "  Qwen3-8B's with LoRA from 5.26 to 4.61 s. The products' roofline is unchanged where they are",
        "  compute-bound (the same FLOPs); with LoRA, whose low-rank products are bound by the bytes they move,",
        "  it falls from 3.34 to 3.14 s.",
        "* **The log-prob head and the q/k norms, read fewer times.** Recompiled again the same evening with the",
        "  accelerators' log-prob head blocks of up to 8192 tokens and its online logsumexp in one pass",
        "  (`MemoryForms.online_softmax`), and the q/k norms and RoPE differentiated by a written-out backward pass",
        "  (`layers.normalized_rope`): with the memory-bound work, Qwen3-1.7B's update from 1.48 to 1.45 s, Qwen3-4B's",
        "  from 3.18 to 3.15 s, Qwen3-8B's with LoRA from 4.61 to 4.57 s, Qwen3-14B's on a v5p-16 from 3.44 to 3.42",
        "  s; the products' roofline unchanged. Most of it is the head's: compiled for an H100 the same changes take",
        "  7% off the update's estimate ([gpu.md](gpu.md)), where XLA:GPU had split the norms' backward into more",
        "  passes than XLA:TPU does.",
        "* **Packing fits with splash attention, but the estimate makes it slower.** With `packing=true`, a",
        "  group's prompt and its 8 completions share one row of 512 + 8 x 1024 = 8704 tokens. Through the XLA",
        "  form, attention is dense over it (each layer's scores `[rows, kv heads, group, 8704, 8704]` float32,",
        "  several kept): Qwen3-4B's update needed 33 GiB of temporaries on a 16 GiB v5e. Through splash (the TPU",
        "  default, which takes the packed segments), it needs 9.18 GiB per chip (temporaries 6.37) and fits;",
        "  but it is estimated at 6.73 s an update (5.28 s in the splash kernels) against 2.06 s unpacked, for",
        "  the same model FLOPs: the segments are known only at run time, so the kernels are counted at every",
        "  block the causal mask visits over 8704 positions, an upper bound (blocks between two completions are",
        "  skipped at run time). The recipes train on unpacked rows of 1536 tokens until a TPU times it.",
        "* **A remat policy buys back the recomputed products for HBM.** The recipes recompute each layer whole in",
        "  the backward pass (`remat_policy=full`: 8 N FLOPs a trained token). `save_projections` keeps every",
        "  projection's output and splash's output and log-sum-exp (`jaxgrpo.models.remat`), so no product is",
        "  recomputed and no layer's weights are all-gathered a second time: Qwen3-1.7B's update on a v5e-8 (the",
        "  `_save_projections` report) is estimated at 1.32 against 1.45 s with the memory-bound work (0.71 against",
        "  0.85 s for the products; all-gathers 64 against 440 MiB), for 7.09 against 3.47 GiB per chip;",
        "  `save_attention` (the MLP recomputed) at 1.43 s for 5.12 GiB (compiled before the head's and the norms'",
        "  change). Qwen3-4B's update with `save_projections` (its `_save_projections` report) is estimated at 2.80",
        "  against 3.15 s but needs 15.63 of 16 GiB per chip.",
        "  The recipes keep `full` until a TPU times the difference (the long-sequence variants, up to 13.81 of",
        "  16 GiB with `full`, have no room for it).",
        "* **Splash attention makes the update's memory linear in T.** Qwen3-1.7B's update on a v5e-8, one row",
        "  per chip per micro-batch (the `_t2k`..`_t32k` reports): with `attention=pallas_tpu` its temporaries",
        "  are 1.93, 4.37, 7.09 and 12.60 GiB at T = 2k, 8k, 16k and 32k (0.34-0.41 GiB per 1k tokens, the",
        "  remat-saved layer inputs), so 32k-token sequences fit (13.81 of 16 GiB); with `attention=xla` they",
        "  are 2.66 and 10.62 GiB at 2k and 8k, and the compiler refuses 16k and 32k (29.5 and 105 GiB needed:",
        "  the `f32[.., T, T]` scores). Qwen3-8B at T = 16k on a v5p-8: 32.83 GiB per chip with splash against",
        "  86.37 with the XLA form (temporaries 21.38 against 74.93).",
        "* **Splash attention makes the update faster, by the estimate.** With splash's kernels counted at their",
        "  analytic cost (the blocks the causal mask visits: 36 of 64 at T = 4096), Qwen3-1.7B's update on a",
        "  v5e-8 is estimated at 1.18, 2.63 and 6.17 s at T = 2k, 4k and 8k with splash, of which the kernels",
        "  0.13, 0.48 and 1.83 s, against 1.51, 3.95 and 11.48 s with the XLA form: 0.78x, 0.67x and 0.54x;",
        "  Qwen3-8B at T = 16k on a v5p-8, 48.3 s (15.7 in the kernels) against 75.7 s: 0.64x. Attention's",
        "  share grows with T: at 32k the kernels are 27.9 of Qwen3-1.7B's 45.5 s (estimated MFU 30%).",
        "  The XLA form computes every block of the scores and its products move them as float32 `[T, T]`",
        "  arrays, which makes them bandwidth-bound at these shapes (each product at its roofline: XLA may fuse",
        "  some of that traffic away on a TPU, so the XLA rows' time is an upper bound; the compiler's own",
        "  estimate, which counts each loop body once, is not comparable). Only a TPU can time either.",
        "* **The engine's decode step with the paged kernel is within 3% of its HBM floor** (the *engine* rows,",
        "  `attention=pallas_tpu`, the TPU default), the kernel counted over the pool's positions, the worst case",
        "  the floor takes: Qwen3-1.7B on a v5e-8, one host's engine of 64 slots, 4.56 against 4.49 ms with the",
        "  pool full, 2.84 against 2.77 ms half full; Qwen3-8B with LoRA adapters, 9.36 against 9.56 ms.",
        "  `benchmarks/decode_roofline.py` estimates the kernel over the live length instead",
        "  (`benchmarks/results/decode_roofline.md`).",
        "* **QLoRA's 4-bit base costs the decode its dequantization.** With `lora.quantize_base=nf4` the engine's",
        "  decode holds less (6.16 against 8.95 GiB per chip, pool full), but its products read the bfloat16",
        "  weights qwix dequantizes every step: 9.36 ms against a 7.50 ms floor that reads the 4-bit weights",
        "  (1.25x; 1.35x half full), and 26.7 ms with the memory-bound work, the dequantization writing and",
        "  reading bfloat16 weights, against 9.7 ms for the bfloat16 base. Its update, 4.17 against 5.30 GiB per",
        "  chip, is estimated 4% slower (4.76 against 4.57 s with the memory-bound work).",
        "* **The CPU forms reach no TPU program.** The decoder's bit-level reads behind optimization barriers,",
        "  the barrier on the tied unembedding and the 32-slot cache chunks were chosen by dtype and reached",
        "  every bfloat16 TPU program; they are now traced only for CPU targets (`--cpu-forms` compiles them",
        "  for a TPU to compare). Compiled both ways, Qwen3-4B's engine on a v5e-8 (the *CPU forms* rows against",
        "  its plain ones) has about the same products' roofline (7.05 against 7.01 ms a pool-full decode step)",
        "  and needs more HBM with the CPU forms: 10.34 against 6.24 GiB per chip with the pool full, 6.97",
        "  against 4.56 half full, 5.84 against 5.43 for the prefill. Nothing shows they help a TPU.",
        "* **Compile time depends on the machine's load.** The 8B update once took 615 s with the 2 cores",
        "  shared by several compiling processes (load ~16), and 41 s compiled alone (load ~5); the 4B update",
        "  took 795 s at load 16.2 and 150 s at load 6.0, 91 s at load 2.0, and 69 s at load 3.9 (the report above).",
        "  The load is in each report's JSON.",
        "",
        "## A peer compiled the same way",
        "",
        "`benchmarks/peer_tunix_compile.py` compiles google-tunix 0.1.7's GRPO training step (its Qwen3, remat",
        "per decoder layer, `grpo_loss_fn`, AdamW) for the same model, shapes and topology. tunix jits one",
        "micro-batch and accumulates outside the program, so jaxgrpo's update (4 micro-batches in one",
        "program) is compared per micro-batch. tunix 0.1.7 imports only with google-metrax, qwix, jaxtyping,",
        "wadler_lindig, clu, omegaconf, antlr4-python3-runtime, kagglehub, sentencepiece and perfetto",
        "installed beside it (the script's docstring says how, outside this environment), and its",
        "`grpo_loss_fn` reads a `temperature` its `GRPOConfig` lacks (set to 1.0 by the script).",
        "",
        *peers(reports, load_peers(directory)),
        "",
        "## Reproduce",
        "",
        "```",
    ]
    for r in reports:
        overrides = " ".join(r.get("overrides") or [])
        programs = dict.fromkeys("engine" if p["program"].startswith("engine") else p["program"] for p in r["programs"])
        out.append(f"jaxgrpo-compile {r.get('experiment', '?')} --topology {r['topology']} --programs "
                   f"{' '.join(programs)}{' --set ' + overrides if overrides else ''}"
                   f"{' --cpu-forms' if r.get('cpu_forms') else ''} --json docs/tpu/{r['name']}.json")
    out += ["```", "", f"then `{COMMAND}` re-renders this page (`--record` does both and adds the machine's load)."]
    return "\n".join(out) + "\n"


def record(experiment: str, topology: str, programs: list[str], overrides: list[str], cpu_forms: bool = False,
           name: str | None = None, directory: str = REPORTS) -> int:
    """Compiles `experiment` for `topology` with `jaxgrpo-compile` and saves its report with the load as
    docs/tpu/NAME.json (NAME: the experiment's file name by default)."""
    name = name or os.path.splitext(os.path.basename(experiment))[0]
    path = os.path.join(directory, f"{name}.json")
    command = [sys.executable, "-c", "import sys; from jaxgrpo.tools import cli; sys.exit(cli.compile_main(sys.argv[1:]))",
               experiment, "--topology", topology, "--programs", *programs, "--json", path]
    if overrides:
        command += ["--set", *overrides]
    if cpu_forms:
        command.append("--cpu-forms")
    load = os.getloadavg()[0]
    code = subprocess.call(command)
    if not os.path.exists(path):
        return code or 1
    with open(path) as f:
        report = json.load(f)
    report.update(experiment=experiment, overrides=overrides, cpu_forms=cpu_forms, load_average=round(max(load, os.getloadavg()[0]), 1))
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    return code


def retrace(report: dict) -> list[str]:
    """Adds the roofline estimate with the memory-bound work to `report`'s update and forward (traced again, not
    compiled), where the new trace's products' estimate is the report's; returns the programs it could not."""
    import jax

    from jaxgrpo import train
    from jaxgrpo.config import apply_overrides, load_experiment
    from jaxgrpo.models import backend
    from jaxgrpo.tools import compile as aot

    cfg = load_experiment(os.path.join(ROOT, report["experiment"]))
    apply_overrides(cfg, list(report.get("overrides") or []))
    if cfg.attention == "auto":  # what "auto" was when the report was compiled (xla before pallas_tpu was the default)
        cfg.attention = report.get("attention", "auto")
    chip, devices = aot.topology_devices(report["topology"])
    mesh, chips, skipped = train.make_mesh(cfg, devices), len(devices), []
    lower = {"update": aot.lower_update, "forward": aot.lower_forward}
    with backend.force_cpu_forms(bool(report.get("cpu_forms"))):
        abstract = aot.abstract_train_state(cfg, mesh)
        for program in report["programs"]:
            if program["program"] not in lower:
                continue
            _, _, jaxpr = lower[program["program"]](cfg, mesh, abstract)
            count = aot.count_products(jaxpr, chip.peak_flops * chips, chip.hbm_bandwidth * chips)
            if abs(count.roofline_seconds - program["estimated_seconds"]) > 0.01 * program["estimated_seconds"]:
                skipped.append(f"{program['program']} (products {count.roofline_seconds:.3f} s now, "
                               f"{program['estimated_seconds']:.3f} s in the report)")
                continue
            with_memory = count.with_memory_seconds
            model_seconds = program["model_flops_seconds"]
            program.update(memory_bound_bytes=count.memory_bound_bytes / chips,
                           memory_bound_seconds=count.memory_bound_seconds, estimated_seconds_with_memory=with_memory,
                           mfu_with_memory=model_seconds / with_memory if program.get("mfu") is not None else None,
                           memory_bound_traced_with=f"jax {jax.__version__}")
    return skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/tpu.md from docs/tpu/*.json.")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/tpu.md is stale")
    parser.add_argument("--record", nargs=2, metavar=("EXPERIMENT", "TOPOLOGY"), help="compile and save a report first")
    parser.add_argument("--programs", nargs="*", default=["update"], help="update, forward or engine (jaxgrpo-compile's)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cpu-forms", action="store_true", help="compile the decoder's CPU forms (see jaxgrpo-compile)")
    parser.add_argument("--name", help="the report's file name in docs/tpu/ (default: the experiment's)")
    parser.add_argument("--retrace", action="store_true",
                        help="add the estimate with memory-bound work to the reports (traced again, not compiled)")
    parser.add_argument("path", nargs="?", default=DOC_PATH)
    args = parser.parse_args(argv)
    if args.record:
        record(*args.record, args.programs, args.set, args.cpu_forms, args.name)
    if args.retrace:
        for path in sorted(glob.glob(os.path.join(REPORTS, "*.json"))):
            with open(path) as f:
                report = json.load(f)
            if "peer" in report or not any(p["program"] in ("update", "forward") for p in report["programs"]):
                continue
            skipped = retrace(report)
            print(f"{os.path.basename(path)}: " + (f"not retraced: {', '.join(skipped)}" if skipped else "retraced"),
                  flush=True)
            with open(path, "w") as f:
                json.dump(report, f, indent=2)
    text = render()
    if args.check:
        with open(args.path) as f:
            if f.read() != text:
                print(f"{args.path} is stale: run `{COMMAND}` and commit the result", file=sys.stderr)
                return 1
        return 0
    with open(args.path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
