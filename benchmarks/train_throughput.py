"""Forward+backward throughput of SmolLM2-135M (float32) against this machine's measured matmul peak.

    python benchmarks/train_throughput.py [--shapes 8x128 16x256] [--repeats 5] [--out benchmarks/results/train_throughput.json]

What is timed is the gradient the trainer's update computes: `jaxgrpo.train.step.completion_outputs`
(the decoder, then chunked log-probs and entropies of every next token) under `jax.value_and_grad`,
jitted, on B x T tokens, after one compile, with the layers rematerialized in the backward pass as the
trainer does by default (`--no-remat` stores their activations instead; the recomputed forward is not
counted as model FLOPs).

On a shared machine the CPU share of this process drifts, so every timing is paired with an adjacent
timing of the peak matmul, and the fraction of peak is the median over pairs of (model FLOP/s) /
(peak FLOP/s measured next to it); absolute rates are reported as medians too.

Model FLOPs per step (PaLM's MFU convention, Chowdhery et al. 2022, appendix B):
6 * N * tokens + 12 * L * H * Q * T * tokens, where N counts every parameter (the tied embedding once:
it is the output projection's matmul), L layers, H query heads of size Q, T the sequence length. The
peak is measured, not taken from a data sheet: the FLOP/s of a jitted 2048^3 float32 matmul.

To find where the rest goes, the step is split into its parts (the layer stack; the log-prob head;
the forward pass alone), each timed against the adjacent peak with its own model FLOPs (XLA's
compiled cost analysis counts a loop body once, and the layers run in a `lax.scan`, so its totals
are reported only as a cross-check of the bytes moved), and the model's own matmul shapes are timed
alone to show what this CPU's matmul reaches at those sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

PEAK_N = 2048


def median_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class PeakMatmul:
    """A compiled PEAK_N^3 float32 matmul; `flops_per_second()` times one run of it."""

    def __init__(self, n: int = PEAK_N):
        self.a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        self.b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
        self.fn = jax.jit(jnp.matmul)
        self.flops = 2.0 * n**3
        jax.block_until_ready(self.fn(self.a, self.b))

    def flops_per_second(self) -> float:
        start = time.perf_counter()
        jax.block_until_ready(self.fn(self.a, self.b))
        return self.flops / (time.perf_counter() - start)


def paired(fn, args, peak: PeakMatmul, repeats: int) -> tuple[list[float], list[float]]:
    """(seconds of fn, peak FLOP/s) for `repeats` adjacent pairs, after compiling fn."""
    jax.block_until_ready(fn(*args))
    seconds, peaks = [], []
    for _ in range(repeats):
        peaks.append(peak.flops_per_second())
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return seconds, peaks


def model_flops(config, num_params: int, batch: int, length: int) -> float:
    """Model FLOPs of one forward+backward pass over batch x length tokens (see the module docstring)."""
    tokens = batch * length
    attention = 12 * config.num_layers * config.num_heads * config.head_dim * length
    return 6.0 * num_params * tokens + attention * tokens


def part_flops(config, num_params: int, batch: int, length: int) -> dict:
    """Model FLOPs of each timed part (same convention as `model_flops`)."""
    tokens = batch * length
    attention = 12 * config.num_layers * config.num_heads * config.head_dim * length * tokens
    head = 6.0 * config.hidden_size * config.vocab_size * batch * (length - 1)
    layers = 6.0 * (num_params - config.vocab_size * config.hidden_size) * tokens + attention
    total = model_flops(config, num_params, batch, length)
    return {"train_step": total, "forward": total / 3, "layer_stack": layers, "logprob_head": head}


def compiled_cost(fn, *args) -> dict:
    """XLA's cost analysis of the compiled function: flops and bytes accessed."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def step_functions(model):
    """(train_grad, forward, layers_grad, head_grad) as functions of (params, tokens...) for `model`."""
    from jaxgrpo.models.attention import AttentionLayout
    from jaxgrpo.models.logprobs import token_logprobs_and_entropy
    from jaxgrpo.train import Policy, completion_outputs

    graphdef, params, rest = nnx.split(Policy(model), nnx.Param, ...)

    def loss(p, tokens, mask, positions):
        policy = nnx.merge(graphdef, p, rest)
        logp, entropy, _ = completion_outputs(policy, tokens, mask, positions, tokens.shape[1] - 1, 1.0, with_values=False)
        return -logp.mean() + 0.0 * entropy.mean()

    def layers_loss(p, tokens, mask, positions):
        hidden = nnx.merge(graphdef, p, rest).decoder.forward(tokens, positions, AttentionLayout.padded(mask))
        return jnp.mean(hidden * hidden)

    def head_loss(hidden, unembedding, targets):
        logp, entropy = token_logprobs_and_entropy(hidden, unembedding, targets)
        return -logp.mean() + 0.0 * entropy.mean()

    return params, {
        "train_step": jax.value_and_grad(loss),
        "forward": loss,
        "layer_stack": jax.value_and_grad(layers_loss),
        "logprob_head": jax.value_and_grad(head_loss, argnums=(0, 1)),
    }


def measure_shape(model, params, fns, batch: int, length: int, repeats: int, peak: PeakMatmul) -> dict:
    config = model.config
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, length)), jnp.int32)
    mask = jnp.ones((batch, length), bool)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    hidden = jnp.asarray(rng.normal(size=(batch, length - 1, config.hidden_size)), jnp.float32)
    unembedding = model.unembedding()
    args = {
        "train_step": (params, tokens, mask, positions),
        "forward": (params, tokens, mask, positions),
        "layer_stack": (params, tokens, mask, positions),
        "logprob_head": (hidden, unembedding, tokens[:, 1:]),
    }
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    flops = model_flops(config, num_params, batch, length)
    row = {"batch": batch, "length": length, "tokens": batch * length, "num_params": num_params, "model_flops": flops,
           "parts": {}}
    flops_of = part_flops(config, num_params, batch, length)
    for name, fn in fns.items():
        seconds, peaks = paired(jax.jit(fn), args[name], peak, repeats)
        cost = compiled_cost(fn, *args[name])
        median_peak = statistics.median(peaks)
        row["parts"][name] = {
            "seconds": statistics.median(seconds), "seconds_all": seconds, "peak_flops_per_second_all": peaks,
            "model_flops": flops_of[name], "xla_cost_analysis": cost,
            "fraction_of_peak": statistics.median(flops_of[name] / s / p for s, p in zip(seconds, peaks)),
            # The time the part would take at the (adjacent) matmul peak.
            "compute_bound_seconds": flops_of[name] / median_peak,
        }
        if name == "train_step":
            row["fraction_of_peak_all"] = [flops / s / p for s, p in zip(seconds, peaks)]
            row["peak_flops_per_second"] = median_peak
        p = row["parts"][name]
        print(f"  B={batch} T={length} {name:>13}: {p['seconds']:6.2f} s, model flops {flops_of[name] / 1e9:7.1f} G "
              f"({p['fraction_of_peak']:5.1%} of the adjacent peak)", flush=True)
    step = row["parts"]["train_step"]["seconds"]
    row.update(seconds=step, tokens_per_second=batch * length / step, model_flops_per_second=flops / step,
               fraction_of_peak=statistics.median(row["fraction_of_peak_all"]))
    return row


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["shapes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels, fractions = [], []
    for r in rows:
        for name, part in r["parts"].items():
            labels.append(f"{name}\nB={r['batch']} x T={r['length']}")
            fractions.append(100 * part["fraction_of_peak"])
    bars = left.bar(labels, fractions, color=["C0" if "train_step" in l else "C7" for l in labels])
    left.axhline(60, color="C3", ls="--", label="goal 60% (train step)")
    for bar, value in zip(bars, fractions):
        left.annotate(f"{value:.0f}%", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=9)
    left.set_ylim(0, 100)
    left.tick_params(axis="x", labelsize=7)
    left.set_ylabel("model FLOP/s, % of adjacent fp32 matmul peak")
    left.set_title(f"SmolLM2-135M forward+backward and its parts (peak median {result['peak_flops_per_second'] / 1e9:.0f} GFLOP/s)",
                   fontsize=9)
    left.legend(fontsize=8)
    shapes = result["matmul_shapes"]
    right.barh([s["name"] for s in shapes], [100 * s["fraction_of_peak"] for s in shapes], color="C1")
    right.axvline(100, color="k", lw=0.5)
    right.set_xlabel(f"% of the {PEAK_N}^3 matmul peak")
    right.set_title("the model's own matmul shapes, timed alone")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["8x128", "16x256"], help="BxT")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--no-remat", dest="remat", action="store_false",
                        help="store the layers' activations instead of recomputing them (the trainer's default is remat)")
    parser.add_argument("--out", default="benchmarks/results/train_throughput.json")
    parser.add_argument("--plot", default="docs/benchmarks_train_throughput.png")
    parser.add_argument("--replot", metavar="JSON", help="only redraw the plot from a results file")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), args.plot)
        return

    import jaxgrpo.models

    peak = PeakMatmul()
    first_peak = statistics.median(peak.flops_per_second() for _ in range(args.repeats))
    print(f"float32 matmul peak {first_peak / 1e9:.0f} GFLOP/s ({PEAK_N}^3)")
    model, _ = jaxgrpo.models.load(args.model, remat=args.remat)
    params, fns = step_functions(model)
    rows = []
    for shape in args.shapes:
        batch, length = map(int, shape.lower().split("x"))
        rows.append(measure_shape(model, params, fns, batch, length, args.repeats, peak))
        r = rows[-1]
        print(f"B={batch} T={length}: {r['tokens_per_second']:.0f} tokens/s, {r['model_flops_per_second'] / 1e9:.0f} "
              f"model GFLOP/s = {r['fraction_of_peak']:.1%} of peak (goal 60%)", flush=True)
    c = model.config
    tokens = rows[0]["tokens"]
    shapes = []
    length = rows[0]["length"]
    for name, (heads, m, k, n) in {
        "q/o projection [BT,576]x[576,576]": (1, tokens, c.hidden_size, c.num_heads * c.head_dim),
        "k/v projection [BT,576]x[576,192]": (1, tokens, c.hidden_size, c.num_kv_heads * c.head_dim),
        "MLP up/gate [BT,576]x[576,1536]": (1, tokens, c.hidden_size, c.intermediate_size),
        "MLP down [BT,1536]x[1536,576]": (1, tokens, c.intermediate_size, c.hidden_size),
        "attention scores B*H x [T,64]x[64,T]": (tokens // length * c.num_heads, length, c.head_dim, length),
        "vocabulary chunk [BT,576]x[576,8192]": (1, tokens, c.hidden_size, 8192),
    }.items():
        a = jnp.ones((heads, m, k), jnp.float32)
        b = jnp.ones((heads, k, n), jnp.float32)
        seconds, peaks = paired(jax.jit(jnp.matmul), (a, b), peak, args.repeats)
        flops = 2.0 * heads * m * k * n
        rate = flops / statistics.median(seconds)
        fraction = statistics.median(flops / s / p for s, p in zip(seconds, peaks))
        shapes.append({"name": name, "batch": heads, "m": m, "k": k, "n": n, "flops_per_second": rate,
                       "fraction_of_peak": fraction})
        print(f"  matmul {name} (BT={tokens}): {rate / 1e9:.0f} GFLOP/s = {fraction:.0%} of the adjacent peak")
    all_peaks = [p for r in rows for part in r["parts"].values() for p in part["peak_flops_per_second_all"]]
    result = {"benchmark": "train_throughput", "model": args.model, "dtype": "float32", "remat": args.remat, "jax": jax.__version__,
              "peak_flops_per_second": statistics.median(all_peaks), "peak_flops_per_second_best": max(all_peaks), "peak_matmul": f"{PEAK_N}^3 float32",
              "shapes": rows, "matmul_shapes": shapes, "goal_fraction_of_peak": 0.6}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.plot:
        plot(result, args.plot)
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""))


if __name__ == "__main__":
    main()
