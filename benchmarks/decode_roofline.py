"""A decode step's HBM bytes per chip against its roofline: the Pallas cache kernel and the XLA form.

    python benchmarks/decode_roofline.py                       # Qwen3-1.7B, batch 128 on a v5e-8
    python benchmarks/decode_roofline.py --compile             # also compile the kernels for the topology
    python benchmarks/decode_roofline.py --model qwen3-4b --prompt-length 300 --json out.json

A decode step is memory-bound: every chip reads the weights and its rows' live keys and values once per
token. The estimate here is analytic, because XLA's cost analysis counts nothing inside a Pallas call (it
charges the call its operands' whole size: the whole cache, every layer); `jaxgrpo-compile` counts the
kernel at the cost it states, a full cache (`pallas_decode.full_cache_cost_estimate`), the worst case of
a completion, where this script follows the live length. Per chip and step:

* roofline: the weights (each chip multiplies its rows by every weight: it reads the whole parameter set,
  the all-gathered copy under FSDP) + each prompt's live keys and values once for its G samples (the
  sampler's shared prefix) + each row's live completion slots, at the chip's HBM bandwidth;
* Pallas kernel (`jaxgrpo.models.attention.pallas_decode`): the weights + the cache blocks it copies
  (each row's live range rounded out to whole blocks: left padding below a block boundary and slots past
  the live length in the last block are read) + its queries and state, plus ~0.35 us per grid step
  (one per cache row and layer); it assumes the kernel's DMAs run at the HBM bandwidth and hide its
  arithmetic, which only a TPU can confirm;
* XLA form (the decoder's TPU path today, one masked block over the whole capacity): the weights + every
  slot of both caches, live or not.

The weights' term is the same for all three, so the cache columns are also given alone. Nothing is timed.
With `--compile` the kernels (not interpreted) are compiled for the topology at these shapes, rows split
over the chips, showing they fit and that the program copies no layer of the cache (its temporaries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxgrpo.models import architectures  # noqa: E402
from jaxgrpo.models.attention.pallas_decode import default_block_size, live_blocks  # noqa: E402
from jaxgrpo.tools import compile as aot  # noqa: E402

# The fixed cost of one Pallas TPU grid step ("~0.35 us", the Pallas TPU pipelining guide). The kernel runs
# one step per cache row and layer; its loop over a row's blocks is not charged (its DMAs are).
GRID_STEP_SECONDS = 0.35e-6


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """One decode step of the sampler: `prompts` prompts of `samples` rows each, prompts left-padded to the
    `prompt_bucket` with `prompt_length` real tokens, `completion_bucket` completion slots of which `live`
    are written, `chips` chips splitting the rows."""

    layers: int
    kv_heads: int
    groups: int
    head_dim: int
    num_params: int
    prompts: int
    samples: int
    prompt_bucket: int
    prompt_length: int
    completion_bucket: int
    chips: int
    dtype_bytes: int = 2

    @property
    def rows(self) -> int:
        return self.prompts * self.samples

    def slot_bytes(self) -> int:
        """Bytes of one slot's keys and values over every layer and kv head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def parameter_count(config) -> int:
    """Parameters of a decoder config: embeddings (and an untied output projection), attention, MLP, norms."""
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    attention = e * d * (2 * config.num_heads + 2 * config.num_kv_heads)
    if config.qkv_bias:
        attention += d * (config.num_heads + 2 * config.num_kv_heads)
    norms = 2 * e + (2 * d if config.qk_norm else 0) + (2 * e if config.is_gemma else 0)
    embeddings = config.vocab_size * e * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_layers * (attention + 3 * e * f + norms) + e


def blocks_read(low: int, high: int, block: int) -> int:
    """Slots the kernel copies for one (row, layer) whose live slots are [low, high): the whole blocks
    meeting the range (`live_blocks`, what the kernel loops over)."""
    return int(live_blocks(low, high, block)[1]) * block


def step_bytes(shape: DecodeShape, live: int, prompt_block: int, completion_block: int) -> dict[str, float]:
    """Per-chip HBM bytes of one step with `live` completion slots written: the roofline's, the kernel's
    and the XLA form's, each with and without the weights."""
    rows, prompts = shape.rows / shape.chips, shape.prompts / shape.chips
    slot = shape.slot_bytes()
    weights = shape.num_params * shape.dtype_bytes
    padding = shape.prompt_bucket - shape.prompt_length
    roofline_cache = slot * (prompts * shape.prompt_length + rows * live)
    kernel_slots = (prompts * blocks_read(padding, shape.prompt_bucket, prompt_block)
                    + rows * blocks_read(0, live, completion_block))
    # Queries in, (max, normalizer, output) float32 out, for both calls, every layer.
    per_query = shape.layers * shape.kv_heads * shape.groups * (shape.head_dim * shape.dtype_bytes
                                                                + 4 * (shape.head_dim + 2))
    kernel_cache = slot * kernel_slots + 2 * rows * per_query
    xla_cache = slot * (prompts * shape.prompt_bucket + rows * shape.completion_bucket)
    return {"weights": weights, "roofline_cache": roofline_cache, "kernel_cache": kernel_cache,
            "xla_cache": xla_cache, "roofline": weights + roofline_cache, "kernel": weights + kernel_cache,
            "xla": weights + xla_cache}


def estimate(shape: DecodeShape, chip: aot.Chip, fill_levels, block_size: int | None = None) -> dict:
    """The table's rows at each fill level and averaged over a whole generation (live = 1 .. completion_bucket)."""
    prompt_block = block_size or default_block_size(shape.prompt_bucket)
    completion_block = block_size or default_block_size(shape.completion_bucket)

    grid_steps = shape.layers * (shape.rows + shape.prompts) // shape.chips  # the completion and prefix calls

    def row(figures, label):
        seconds = {k: v / chip.hbm_bandwidth for k, v in figures.items()}
        seconds["kernel"] += grid_steps * GRID_STEP_SECONDS
        return {"live": label, **{f"{k}_bytes": v for k, v in figures.items()},
                "roofline_ms": seconds["roofline"] * 1e3, "kernel_ms": seconds["kernel"] * 1e3,
                "xla_ms": seconds["xla"] * 1e3, "kernel_over_roofline": seconds["kernel"] / seconds["roofline"],
                "xla_over_roofline": seconds["xla"] / seconds["roofline"],
                "kernel_cache_over_live": figures["kernel_cache"] / figures["roofline_cache"]}

    rows = [row(step_bytes(shape, live, prompt_block, completion_block), live) for live in fill_levels]
    every = [step_bytes(shape, live, prompt_block, completion_block) for live in range(1, shape.completion_bucket + 1)]
    mean = {k: sum(f[k] for f in every) / len(every) for k in every[0]}
    rows.append(row(mean, f"mean of 1..{shape.completion_bucket}"))
    return {"shape": {**dataclasses.asdict(shape), "rows": shape.rows}, "chip": chip._asdict(), "prompt_block": prompt_block,
            "completion_block": completion_block, "grid_steps": grid_steps, "rows": rows}


def compile_kernels(shape: DecodeShape, topology: str) -> dict:
    """Compile the completion-cache and shared-prefix calls for `topology`; their memory per chip."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxgrpo.models.attention.pallas_decode import cache_attention_state

    _, devices = aot.topology_devices(topology)
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)

    def spec(shape_, dtype, *axes):
        return jax.ShapeDtypeStruct(shape_, dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))

    def cache(rows, capacity):
        return spec((shape.layers, rows, shape.kv_heads, capacity, shape.head_dim), jnp.bfloat16, None, "data")

    q = spec((shape.rows, 1, shape.kv_heads, shape.groups, shape.head_dim), jnp.bfloat16, "data")
    scalar = spec((), jnp.int32)
    scale = shape.head_dim ** -0.5

    def step(q, cache_k, cache_v, prefix_k, prefix_v, layer, cache_index, prefix_start):
        completion = cache_attention_state(q, cache_k, cache_v, layer, cache_index, scale, mesh=mesh)
        prefix = cache_attention_state(q, prefix_k, prefix_v, layer, shape.prompt_bucket, scale,
                                       valid_start=prefix_start, mesh=mesh)
        return completion, prefix

    completion_cache, prompt_cache = cache(shape.rows, shape.completion_bucket), cache(shape.prompts, shape.prompt_bucket)
    compiled = jax.jit(step).lower(q, completion_cache, completion_cache, prompt_cache, prompt_cache, scalar, scalar,
                                   spec((shape.prompts,), jnp.int32, "data")).compile()
    memory = compiled.memory_analysis()
    return {"topology": topology, "argument_bytes": memory.argument_size_in_bytes,
            "temp_bytes": memory.temp_size_in_bytes, "output_bytes": memory.output_size_in_bytes,
            "mosaic_calls": compiled.as_text().count("tpu_custom_call")}


def markdown(result: dict) -> str:
    s, chip = result["shape"], result["chip"]
    gb = lambda x: f"{x / 1e9:.3f}"  # noqa: E731
    lines = [
        f"# Decode step per chip: {s['rows']} rows ({s['prompts']} prompts x {s['samples']}) over {s['chips']} "
        f"x {chip['name']} ({chip['hbm_bandwidth'] / 1e9:.0f} GB/s)",
        "",
        f"{s['layers']} layers, {s['kv_heads']} kv heads x {s['groups']} query heads of {s['head_dim']}, "
        f"{s['num_params'] / 1e9:.3f}B parameters; prompt bucket {s['prompt_bucket']} ({s['prompt_length']} real), "
        f"completion bucket {s['completion_bucket']}; kernel blocks {result['prompt_block']} (prompt) and "
        f"{result['completion_block']} (completion) slots. Analytic: bytes / HBM bandwidth, and for the kernel "
        f"{result['grid_steps']} grid steps x {GRID_STEP_SECONDS * 1e6:.2f} us.",
        "",
        "| live slots | weights GB | live cache GB | kernel cache GB | XLA cache GB | roofline ms | kernel ms "
        "| XLA ms | kernel / roofline | XLA / roofline | kernel cache / live |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['live']} | {gb(r['weights_bytes'])} | {gb(r['roofline_cache_bytes'])} | "
                     f"{gb(r['kernel_cache_bytes'])} | {gb(r['xla_cache_bytes'])} | {r['roofline_ms']:.3f} | "
                     f"{r['kernel_ms']:.3f} | {r['xla_ms']:.3f} | {r['kernel_over_roofline']:.3f} | "
                     f"{r['xla_over_roofline']:.3f} | {r['kernel_cache_over_live']:.3f} |")
    if "compiled" in result:
        c = result["compiled"]
        lines += ["", f"Compiled for {c['topology']} ({c['mosaic_calls']} Mosaic calls): arguments "
                  f"{c['argument_bytes'] / 2**30:.3f} GiB per chip, temporaries {c['temp_bytes']} B, outputs "
                  f"{c['output_bytes']} B: no layer of either cache is copied."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-1.7b", choices=architectures.names())
    parser.add_argument("--topology", default="v5e:2x4", help="the chips' kind and count, e.g. v5e:2x4")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-bucket", type=int, default=512)
    parser.add_argument("--prompt-length", type=int, default=300, help="real prompt tokens (the rest left padding)")
    parser.add_argument("--completion-bucket", type=int, default=3584, help="completion slots (capacity 4096 in all)")
    parser.add_argument("--fill", type=int, nargs="*", default=[1, 256, 1024, 2048, 3584])
    parser.add_argument("--block-size", type=int, default=None, help="kernel block (default: default_block_size)")
    parser.add_argument("--compile", action="store_true", help="compile the kernels for the topology (libtpu)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    generation = args.topology.split(":", 1)[0]
    if generation not in aot.CHIPS:
        parser.error(f"unknown chip {generation!r} in --topology; one of {', '.join(aot.CHIPS)}")
    chips = math.prod(int(x) for x in args.topology.split(":", 1)[1].split("x"))
    if not 0 < args.prompt_length <= args.prompt_bucket:
        parser.error(f"--prompt-length {args.prompt_length} must lie in [1, --prompt-bucket {args.prompt_bucket}]")
    if (args.prompts * args.samples) % chips or args.prompts % chips:
        parser.error(f"{args.prompts} prompts x {args.samples} samples must split evenly over {chips} chips")
    if any(not 0 < n <= args.completion_bucket for n in args.fill):
        parser.error(f"--fill levels must lie in [1, --completion-bucket {args.completion_bucket}]")
    config = architectures.decoder_config(args.model)
    shape = DecodeShape(config.num_layers, config.num_kv_heads, config.num_heads // config.num_kv_heads,
                        config.head_dim, parameter_count(config), args.prompts, args.samples, args.prompt_bucket,
                        args.prompt_length, args.completion_bucket, chips)
    result = estimate(shape, aot.CHIPS[generation], args.fill, args.block_size)
    if args.compile:
        result["compiled"] = compile_kernels(shape, args.topology)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
