"""Per-device memory of the jitted GRPO update on 1, 2, 4 and 8 (fake CPU) devices, FSDP and FSDP x TP.

    python benchmarks/scaling_memory.py [--devices 1 2 4 8] [--models 135m 1b] [--out benchmarks/results/scaling_memory.json]

Nothing is executed and no weights are needed: the policy is built with `nnx.eval_shape`, its parameters
and AdamW state become abstract arrays laid out by `jaxgrpo.models.partitioning` (the trainer's own
rules), and the trainer's own jitted update (`jaxgrpo.train.step.make_update_fn`: ppo_clip loss, chunked
log-probs, gradient, AdamW) is lowered and compiled for each mesh. Reported per device:

* parameters and optimizer state: the bytes of each array's shard (`sharding.shard_shape`);
* temporaries ("activations" in the JSON): XLA's compiled memory analysis, `temp_size_in_bytes`:
  everything the step allocates besides its arguments and outputs (activations kept for the backward
  pass, gradients, gathered weights, update buffers); plus the largest buffers of the compiled program.

Meshes (data, fsdp, model): FSDP is (1, N, 1); FSDP x TP is (1, N/2, 2) for N >= 2 (tensor
parallelism over 2 devices, FSDP over the rest). The decoder keeps its activations split over the
batch axes (and heads / MLP hidden over `model`) on any active mesh, so temporaries scale too. The
batch (8 sequences of 128 prompt + 128 completion tokens) is fixed, so ideal scaling is 1/N for
every column.
"""

import os
import sys

# Fake devices must exist before jax is imported (here and in any process running this file).
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse
import json
import math
import re
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from jaxgrpo.config import Config
from jaxgrpo.models import Decoder, DecoderConfig
from jaxgrpo.models.partitioning import DEFAULT_RULES, logical_to_mesh_spec
from jaxgrpo.train import Policy, TrainBatch, TrainState, make_optimizer, make_update_fn

#: Shapes only. 135m is SmolLM2-135M; 1b is Llama 3.2 1B (hidden 2048, 16 layers, 32/8 heads, 128k vocabulary).
MODELS = {
    "135m": DecoderConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                          num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True),
    "1b": DecoderConfig(family="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                        num_heads=32, num_kv_heads=8, head_dim=64, tie_word_embeddings=True),
}
SCHEMES = ("fsdp", "fsdp_tp")
BATCH, PROMPT, COMPLETION = 8, 128, 128


def mesh_shape(scheme: str, devices: int) -> tuple[int, int, int]:
    """(data, fsdp, model) for `devices` devices under `scheme`."""
    if scheme == "fsdp" or devices == 1:
        return (1, devices, 1)
    if scheme == "fsdp_tp":
        return (1, devices // 2, 2)
    raise ValueError(f"unknown scheme {scheme!r}; valid: {', '.join(SCHEMES)}")


def shard_bytes(tree) -> int:
    """Bytes one device holds of the abstract arrays in `tree` (the largest shard of each array)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def global_bytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def abstract_state(config: DecoderConfig, mesh, optimizer, rules=DEFAULT_RULES):
    """(graphdef, rest, TrainState of sharded abstract arrays) for a policy of `config` on `mesh`."""
    policy = nnx.eval_shape(lambda: Policy(Decoder(config, rngs=nnx.Rngs(0))))
    graphdef, params, rest = nnx.split(policy, nnx.Param, ...)

    def place(variable):
        value = variable.get_value()
        spec = logical_to_mesh_spec(variable.get_metadata()["logical_axes"], value.shape, mesh, rules)
        return variable.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, spec)))

    params = jax.tree.map(place, params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    # Moments take their parameter's layout, as `optimizer.init` on sharded arrays gives them; counters are replicated.
    replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
    param_structure = jax.tree.structure(params)

    def layout(node):
        if jax.tree.structure(node) == param_structure:
            return jax.tree.map(lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding), node, params)
        return jax.ShapeDtypeStruct(node.shape, node.dtype, sharding=replicated)

    opt_state = jax.tree.map(layout, jax.eval_shape(optimizer.init, params),
                             is_leaf=lambda node: jax.tree.structure(node) == param_structure)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    return graphdef, rest, TrainState(params, opt_state, step)


def abstract_batch(mesh, batch: int, prompt: int, completion: int) -> TrainBatch:
    """One minibatch (a single micro-batch) of abstract arrays, shaped as the trainer feeds its update."""
    length = prompt + completion
    i32 = lambda *s: jax.ShapeDtypeStruct((1, batch) + s, jnp.int32)
    f32 = lambda *s: jax.ShapeDtypeStruct((1, batch) + s, jnp.float32)
    return TrainBatch(i32(length), jax.ShapeDtypeStruct((1, batch, length), jnp.bool_), i32(length),
                      f32(completion), f32(completion), f32(completion), f32(completion), f32(completion), f32(completion))


def largest_buffers(hlo_text: str, count: int = 3) -> list[dict]:
    """The `count` largest distinct array shapes the compiled program produces (what fills its temporaries)."""
    itemsize = {"f32": 4, "s32": 4, "bf16": 2, "pred": 1, "u32": 4, "f16": 2}
    found = {}
    for match in re.finditer(r"= (f32|s32|bf16|pred|u32|f16)\[([\d,]+)\]\S* ([a-z-]+)\(", hlo_text):
        if match.group(3) == "parameter":  # a value passed in, produced (and counted) elsewhere
            continue
        dims = tuple(int(d) for d in match.group(2).split(","))
        key = f"{match.group(1)}[{','.join(map(str, dims))}]"
        found.setdefault(key, {"shape": key, "op": match.group(3), "mib": math.prod(dims) * itemsize[match.group(1)] / 2**20})
    return sorted(found.values(), key=lambda b: -b["mib"])[:count]


def measure(model: str, scheme: str, devices: int, *, batch=BATCH, prompt=PROMPT, completion=COMPLETION,
            configs=MODELS) -> dict:
    """Per-device bytes of parameters, optimizer state and activations of one compiled update."""
    config = configs[model]
    shape = mesh_shape(scheme, devices)
    mesh = jax.make_mesh(shape, ("data", "fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3,
                         devices=jax.devices()[:devices])
    cfg = Config()
    cfg.sampling.max_new_tokens = completion
    cfg.aggregation = "token_mean"
    optimizer = make_optimizer(cfg.optimizer)
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        graphdef, rest, state = abstract_state(config, mesh, optimizer)
        state_sharding = jax.tree.map(lambda x: x.sharding, state)
        update = make_update_fn(cfg, graphdef, rest, optimizer, mesh, state_sharding)
        compiled = update.lower(state, abstract_batch(mesh, batch, prompt, completion)).compile()
    analysis = compiled.memory_analysis()
    return {
        "model": model, "scheme": scheme, "devices": devices, "mesh": dict(zip(("data", "fsdp", "model"), shape)),
        "num_params": sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
        "param_bytes": shard_bytes(state.params),
        "optimizer_bytes": shard_bytes(state.opt_state),
        "activation_bytes": int(analysis.temp_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "param_bytes_global": global_bytes(state.params),
        "compile_seconds": time.perf_counter() - start,
        "largest_buffers": largest_buffers(compiled.as_text()),
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows}, key=list(MODELS).index)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    colors = {"param_bytes": "C0", "optimizer_bytes": "C1", "activation_bytes": "C2"}
    names = {"param_bytes": "parameters", "optimizer_bytes": "optimizer", "activation_bytes": "temporaries"}
    for ax, model in zip(axes[0], models):
        for scheme, style in (("fsdp", "-o"), ("fsdp_tp", "--s")):
            sel = sorted((r for r in rows if r["model"] == model and r["scheme"] == scheme), key=lambda r: r["devices"])
            if not sel:
                continue
            n = [r["devices"] for r in sel]
            for key, color in colors.items():
                ax.plot(n, [r[key] / 2**20 for r in sel], style, color=color,
                        label=f"{names[key]} ({scheme.replace('_', ' x ').upper()})")
        base = [r for r in rows if r["model"] == model and r["devices"] == 1 and r["scheme"] == "fsdp"]
        if base:
            n = sorted({r["devices"] for r in rows})
            for key, color in colors.items():
                ax.plot(n, [base[0][key] / 2**20 / d for d in n], ":", color=color, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("devices (dotted: ideal 1/N)")
        ax.set_ylabel("MiB per device")
        ax.set_title(f"{model}-shaped Llama, batch {BATCH} x {PROMPT}+{COMPLETION} tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--out", default="benchmarks/results/scaling_memory.json")
    parser.add_argument("--plot", default="docs/benchmarks_memory_scaling.png", help='PNG path, or "none"')
    args = parser.parse_args()
    if max(args.devices) > jax.device_count():
        sys.exit(f"needs {max(args.devices)} devices, found {jax.device_count()}; run with "
                 f"XLA_FLAGS=--xla_force_host_platform_device_count={max(args.devices)}")
    rows = []
    for model in args.models:
        for scheme in args.schemes:
            for devices in args.devices:
                same = [r for r in rows if r["model"] == model and r["devices"] == 1] if devices == 1 else []
                row = dict(same[0], scheme=scheme) if same else measure(model, scheme, devices)  # N=1: one mesh
                rows.append(row)
                print(f"{model:>5} {scheme:>8} N={devices}: params {row['param_bytes'] / 2**20:8.1f} MiB, "
                      f"optimizer {row['optimizer_bytes'] / 2**20:8.1f} MiB, activations "
                      f"{row['activation_bytes'] / 2**20:8.1f} MiB (compiled in {row['compile_seconds']:.0f} s)", flush=True)
    for row in rows:  # scaling relative to one device: 1.0 is perfect 1/N
        base = next(r for r in rows if r["model"] == row["model"] and r["scheme"] == row["scheme"] and r["devices"] == 1)
        for key in ("param_bytes", "optimizer_bytes", "activation_bytes"):
            row[key.replace("_bytes", "_vs_ideal")] = row[key] * row["devices"] / max(base[key], 1)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "scaling_memory", "batch": BATCH, "prompt": PROMPT, "completion": COMPLETION,
                   "jax": jax.__version__, "rows": rows}, f, indent=1)
    plot_path = None if args.plot in ("", "none") else args.plot
    if plot_path:
        plot(rows, plot_path)
    print(f"\nwrote {args.out}" + (f" and {plot_path}" if plot_path else ""))


if __name__ == "__main__":
    main()
