"""pallas_gpu against the XLA reference on a GPU: the same values and gradients, and the time of each.

    PYTHONPATH=. python benchmarks/pallas_gpu_check.py                          # T = 2048, bfloat16
    PYTHONPATH=. python benchmarks/pallas_gpu_check.py --length 8192 --tiling 128,64,8,3 --json out.json

For each layout (left-padded rows, packed segments, packed prompt groups), without and with a sliding
window and soft cap, at a Qwen3-like shape (8 key/value heads of 2 query heads, head_dim 128): the
largest difference of pallas_gpu's outputs on real tokens and of its gradients (q, k, v) of a loss over
them from `xla`'s, relative to the largest entry of `xla`'s, and the median wall time of one jitted
forward + backward of each (after a compiling call, `--repeats` timed calls). Both run on the default
device; on a CPU the kernels run interpreted (a smoke test at a small `--length`, not a timing). Each
line printed (and `--json`) names the device, the JAX version and the tiling it was measured with.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.models import attention
from jaxgrpo.models.attention import AttentionLayout, pallas_gpu


def layouts(batch: int, length: int) -> dict[str, tuple]:
    """(layout, positions, real) per kind: rows left-padded by 0 to length/4 slots; 4 packed segments a row
    and a padded tail; two prompt groups a row, each a trunk of length/8 and 3 branches of length/8 - 1."""
    slots = np.arange(length)
    valid = slots[None] >= (np.arange(batch) * length // (4 * max(batch - 1, 1)))[:, None]
    padded = (AttentionLayout.padded(jnp.asarray(valid)), jnp.asarray(np.maximum(np.cumsum(valid, 1) - 1, 0)), valid)
    segment_ids = np.minimum(slots * 4 // length + 1, 4) * (slots < length - length // 16)
    segment_ids = np.broadcast_to(segment_ids, (batch, length))
    segments = (AttentionLayout.segments(jnp.asarray(segment_ids, jnp.int32)),
                jnp.broadcast_to(jnp.arange(length), (batch, length)), segment_ids != 0)
    trunk, branch = length // 8, length // 8 - 1
    seg, br, pos = np.zeros(length, int), np.zeros(length, int), np.zeros(length, int)
    start = 0
    for group in (1, 2):
        seg[start:start + trunk], pos[start:start + trunk] = group, np.arange(trunk)
        start += trunk
        for b in range(1, 4):
            seg[start:start + branch], br[start:start + branch] = group, b
            pos[start:start + branch] = trunk + np.arange(branch)
            start += branch
    rows = [np.broadcast_to(x, (batch, length)) for x in (seg, br, pos)]
    groups = (AttentionLayout.branches(jnp.asarray(rows[0], jnp.int32), jnp.asarray(rows[1], jnp.int32)),
              jnp.asarray(rows[2], jnp.int32), rows[0] != 0)
    return {"padded": padded, "segments": segments, "branches": groups}


def program(name: str, window, soft_cap, tiling):
    """jit(value_and_grad) of sum(out * weights) in q, k, v through implementation `name`."""
    implementation = attention.get(name)
    options = {"tiling": tiling} if name == "pallas_gpu" else {}

    def loss(q, k, v, masks, weights):
        out = implementation.attend(q, k, v, masks, window is not None, window=window, scale=q.shape[-1] ** -0.5,
                                    logit_soft_cap=soft_cap, **options)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def timed(run, repeats: int) -> float:
    jax.block_until_ready(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--tiling", default=",".join(map(str, pallas_gpu.Tiling())),
                        help="block_q,block_k,num_warps,num_stages")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    tiling = pallas_gpu.Tiling(*map(int, args.tiling.split(",")))
    dtype = jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (args.batch, args.length, args.kv_heads, args.groups, args.head_dim), dtype)
    k, v = (jax.random.normal(key, (args.batch, args.length, args.kv_heads, args.head_dim), dtype) for key in keys[1:3])
    results = []
    for kind, (layout, positions, real) in layouts(args.batch, args.length).items():
        weights = jax.random.normal(keys[3], q.shape) * jnp.asarray(real)[:, :, None, None, None]
        for window, soft_cap in ((None, None), (args.length // 8, 50.0)):
            outputs, seconds = {}, {}
            for name in ("pallas_gpu", "xla"):
                masks = attention.get(name).prepare(layout, positions, window)
                run = program(name, window, soft_cap, tiling)
                (_, out), grads = run(q, k, v, masks, weights)
                outputs[name] = [np.asarray(out, np.float32)[real]] + [np.asarray(g, np.float32) for g in grads]
                seconds[name] = timed(lambda: run(q, k, v, masks, weights), args.repeats)
            errors = {part: float(np.abs(a - b).max() / np.abs(b).max())
                      for part, a, b in zip(("out", "dq", "dk", "dv"), outputs["pallas_gpu"], outputs["xla"])}
            line = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "tiling": list(tiling),
                    "dtype": args.dtype, "layout": kind, "window": window, "soft_cap": soft_cap,
                    "shape": [args.batch, args.length, args.kv_heads, args.groups, args.head_dim],
                    "relative_error": errors, "seconds_fwd_bwd": seconds,
                    "speedup_over_xla": seconds["xla"] / seconds["pallas_gpu"]}
            print(json.dumps(line), flush=True)
            results.append(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
