"""Training and scoring attention through splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`).

Splash attention is flash attention for TPUs: it never holds a [T, T] score matrix, so memory grows
linearly in T, and it skips the blocks of keys its static mask rules out (causal: half of them). Each
row of the batch is one kernel call (vmapped); G query heads share each key/value head (grouped-query
attention natively: head h reads key/value head h // G). The decoder's layouts map onto it as:

* causal in slot order, and a sliding window of w slots: the static mask (`CausalMask`, or
  `LocalMask` keeping keys q - w < s <= q);
* padded rows: segment ids 1 on real tokens and 0 on padding, so real queries see real keys only;
* packed segments: the segment ids themselves;
* packed prompt groups (models/packing.py), where a query sees its segment's trunk and its own branch:
  where the groups sit in a row is computed from the data under `jit`, so no static mask can say it.
  The keys a query sees are two disjoint sets, each one splash call with segment ids: its own
  (segment, branch) (the trunk's queries see the whole of what they may see there), and, for a branch's
  queries, their segment's trunk. The two calls' outputs merge exactly through their log-sum-exps; the
  gradient is flash attention's backward of each call run with the merged output and log-sum-exp (the
  probabilities of the union), summed (`_union`, which every layout goes through: one call for the
  others; the ids and the union are `flash_common`'s, shared with `pallas_gpu`). Sliding layers of this
  layout count their window in positions, which the trunk call cannot express with a static mask (a
  branch's slots are shifted from its positions by the earlier branches' lengths): those layers run the
  XLA form, the only place here that is quadratic.

Rows are padded to a multiple of 128 slots (the kernel's block) with segment ids no real token shares.
`attn_logits_soft_cap` soft-caps the scores (Gemma 2). On a mesh the kernel runs per shard (`shard_map`)
over rows (`data`/`fsdp`) and key/value heads (`model`, where it divides them). On a CPU the kernels run
interpreted (`interpret=True`): for tests, slowly. Splash's calls state no cost, so the ones traced here
carry an analytic `cost_estimate` (`splash_cost_estimates`: the blocks the mask visits), which the compile
report (`jaxgrpo.tools.compile.count_products`) counts.

The sampler's decode steps (a run-time cache index) read the cache and a shared prefix through
`pallas_decode`'s kernel (`cache_state`), which copies only a row's live blocks.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as splash_mask_info

from jaxgrpo.distributed import batch_shards, round_up
from jaxgrpo.models.attention import (AttentionImplementation, AttentionLayout, flash_common, pallas_decode,
                                      paged_at_windows, target_platform, with_window, xla)
from jaxgrpo.models.attention.flash_common import PAD_KEY, PAD_QUERY

#: Slots per block of queries and keys: rows are padded to a multiple of the smallest.
BLOCKS = (512, 256, 128)


def _block(length: int) -> int:
    return next(b for b in BLOCKS if length % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(length: int, heads: int, window: int | None, logit_soft_cap: float | None,
            interpret: bool) -> splash.SplashAttentionKernel:
    """A splash kernel over `heads` query heads and rows of `length` slots, causal or windowed, returning its
    log-sum-exp with the output (for `_union`).

    What `make_splash_mha` builds, with its block tables kept as numpy arrays: constants in any trace, so
    one kernel serves every trace and no tracer leaks from one into another (`make_splash_mha` stages them
    into the trace it is called in)."""
    shape = (length, length)
    mask = splash_mask.CausalMask(shape) if window is None else splash_mask.LocalMask(shape, (window - 1, 0), 0)
    mask = splash_mask.MultiHeadMask([mask] * heads)
    b = _block(length)
    sizes = splash.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                              block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
    forward, mask_function = splash_mask_info.process_mask(mask, (b, b))
    dq, _ = splash_mask_info.process_mask(mask, (b, b))
    dkv, _ = splash_mask_info.process_mask_dkv(mask, (b, b), shrink_grid=True)
    return splash.SplashAttentionKernel(
        forward, dq, dkv, block_sizes=sizes, is_mqa=False, save_residuals=True,
        mask_value=splash.DEFAULT_MASK_VALUE, attn_logits_soft_cap=logit_soft_cap, residual_checkpoint_name=None,
        mask_function=mask_function, interpret=interpret)


def prepare(layout: AttentionLayout, positions: jax.Array, window: int | None) -> dict[str, jax.Array]:
    """Segment ids [B, T] for the splash calls (`flash_common.segment_ids`: query and key ids; for
    branches, both calls'), and for branches with a window the XLA form's window mask [B, T, T] (module
    docstring)."""
    masks = flash_common.segment_ids(layout)
    if layout.kind == "branches" and window:
        masks["window_mask"] = xla.build_branch_mask(layout.segment_ids, layout.branch_ids, positions, window)
    return masks


def _kernel_precision(dtype):
    """The matmul precision the kernels are traced under: a narrow type's products are exact in float32
    whatever it says, and Mosaic refuses a bfloat16 product asked for float32 precision (as a global
    `jax_default_matmul_precision="highest"` asks); float32 keeps the caller's setting."""
    return contextlib.nullcontext() if jnp.dtype(dtype).itemsize >= 4 else jax.default_matmul_precision("default")


def _flat_blocks(info):
    """A mask table with its partial blocks as [blocks, block_q, block_kv], as the kernels take them."""
    if info is None or info.partial_mask_blocks is None:
        return info
    return info._replace(partial_mask_blocks=info.partial_mask_blocks.reshape(-1, *info.partial_mask_blocks.shape[-2:]))


#: Matrix products per visited (query head, query block, key block) of each splash kernel, each
#: [block, D] x [D, block] or [block, block] x [block, D] (splash_attention_kernel.py): the forward
#: (`flash_attention_kernel`) QK^T and PV; dq (`_flash_attention_dq_kernel`) the recomputed QK^T, dP = dO V^T
#: and dQ = dS K; dkv (`_flash_attention_dkv_kernel`, unfused) the recomputed QK^T, dV = P^T dO, dP and dK = dS^T Q.
SPLASH_PRODUCTS = {"fwd": 2, "dq": 3, "dkv": 4}


def splash_cost_estimates(kernel: splash.SplashAttentionKernel, q_shape, kv_shape, dtype) -> dict[str, pl.CostEstimate]:
    """The analytic cost of one splash call per kernel ("fwd", "dq", "dkv") on one row, q [H, T, D] and
    k, v [kv, T, D]: what `count_products` counts for it (splash states no `cost_estimate` of its own).

    A kernel computes only the (query head, query block, key block) triples its mask info marks non-empty
    (`block_mask`, concrete numpy: causal at 8 blocks visits 36 of 64), each `SPLASH_PRODUCTS[kernel]`
    products of 2 * block^2 * D FLOPs and block^2 exponentials. HBM bytes: the per-row arrays it reads and
    writes once (q and out, with the float32 log-sum-exp; dq: q, dO, dq, log-sum-exp and di; dkv: k, v, dk,
    dv), and per visited triple the blocks it streams (forward and dq: k and v; dkv: q and dO, with the
    log-sum-exp and di as [8, block] float32).
    Segment ids and the mask's own tables are left out (a few bytes per slot)."""
    heads, length, head_dim = q_shape
    kv_heads = kv_shape[0]
    itemsize, f32 = jnp.dtype(dtype).itemsize, 4
    per_row = {"fwd": (2 * heads * length * head_dim, heads * length * splash.NUM_LANES * f32),
               "dq": (3 * heads * length * head_dim, 2 * heads * length * f32),
               "dkv": (4 * kv_heads * length * head_dim, 0)}
    infos = {"fwd": kernel.fwd_mask_info, "dq": kernel.dq_mask_info, "dkv": kernel.dkv_mask_info}
    block = kernel.kwargs["block_sizes"].block_q
    costs = {}
    for name, info in infos.items():
        # Mask info shared by all heads has one head; else one per head.
        visited = np.count_nonzero(info.block_mask) * heads // info.block_mask.shape[0]
        elements, extra_bytes = per_row[name]
        if name == "dkv":
            extra_bytes += visited * 2 * splash.NUM_SUBLANES * block * f32
        costs[name] = pl.CostEstimate(
            flops=int(visited * SPLASH_PRODUCTS[name] * 2 * block * block * head_dim),
            transcendentals=int(visited * block * block),
            bytes_accessed=int((elements + visited * 2 * block * head_dim) * itemsize + extra_bytes))
    return costs


class _PallasWithCosts:
    """The `pallas` module as splash's kernels see it, whose `pallas_call` states the analytic
    `cost_estimate` of the kernel it builds (by its name, `splash_mha_{fwd,dq,dkv}...`)."""

    def __init__(self, costs: dict[str, pl.CostEstimate]):
        self._costs = costs

    def __getattr__(self, name):
        return getattr(pl, name)

    def pallas_call(self, kernel, *args, name: str, **kwargs):
        return pl.pallas_call(kernel, *args, name=name, cost_estimate=self._costs[name.split("_")[2]], **kwargs)


# Held while splash's module sees the costing `pl`: two threads tracing splash at once take turns.
_SPLASH_MODULE_LOCK = threading.RLock()


@contextlib.contextmanager
def _stated_costs(costs: dict[str, pl.CostEstimate]):
    """Splash's `pallas_call`s traced in this block carry `costs` (`splash_cost_estimates`), so the
    compile report counts the kernels' work. Splash takes no cost estimate: its module's `pl` is swapped
    for the duration of the trace, under a lock (the previous module comes back on exit)."""
    with _SPLASH_MODULE_LOCK:
        previous = splash.pl
        splash.pl = _PallasWithCosts(costs)
        try:
            yield
        finally:
            splash.pl = previous


def _union(kernel):
    """Attention of one row over the union of disjoint key sets, one splash call each (each set given by
    its `SegmentIds`), merged exactly through their log-sum-exps (`flash_common.lse_union`), with its
    gradient: splash's backward of each call run with the union's output and log-sum-exp, summed.

    `kernel` saves residuals (it returns the log-sum-exp). With one set this is splash attention itself,
    its backward traced here too, under `_kernel_precision`."""

    def forward(q, k, v, segment_ids):
        with _kernel_precision(q.dtype), _stated_costs(splash_cost_estimates(kernel, q.shape, k.shape, q.dtype)):
            out, (lse,) = kernel(q, k, v, segment_ids=segment_ids)
        return out, lse

    def backward(q, k, v, segment_ids, out, lse, d_out, grad_dtype):
        options = kernel.kwargs
        saved = (q, k, v, segment_ids, None, out, lse, _flat_blocks(kernel.dq_mask_info),
                 _flat_blocks(kernel.dkv_mask_info))
        with _kernel_precision(q.dtype), _stated_costs(splash_cost_estimates(kernel, q.shape, k.shape, q.dtype)):
            grads = splash._splash_attention_bwd(
                False, options["mask_value"], options["is_mqa"], options["block_sizes"], None,
                options["mask_function"], options["attn_logits_soft_cap"], options["interpret"], saved, d_out)
        del grad_dtype  # splash writes its gradients in q's dtype (one call's are as asked; the sum's as before)
        return grads[3], grads[4], grads[5]

    return flash_common.lse_union(forward, backward)


def _splash_rows(q, k, v, masks, *, window, logit_soft_cap, interpret):
    """Splash attention of rows q [B, H, T, D], k and v [B, kv, T, D] with `prepare`'s ids; [B, H, T, D]."""
    batch, heads, length, _ = q.shape
    padded = round_up(length, BLOCKS[-1])
    q, k, v = (flash_common.pad(x, 2, padded) for x in (q, k, v))
    ids = {name: flash_common.pad(x, 1, padded, PAD_KEY if name.endswith("key") else PAD_QUERY)
           for name, x in masks.items() if x.ndim == 2}
    # Padding slots share the id PAD_QUERY for queries and keys of the own call: they see each other only.
    ids["key"] = jnp.where(jnp.arange(padded) < length, ids["key"], PAD_QUERY)
    sets = [splash.SegmentIds(ids["query"], ids["key"])]
    if "trunk_query" in ids:
        sets.append(splash.SegmentIds(ids["trunk_query"], ids["trunk_key"]))
    attention = _union(_kernel(padded, heads, window, logit_soft_cap, interpret))
    out = jax.vmap(attention)(q, k, v, sets)
    return out[:, :, :length]


def attend(q, k, v, masks, sliding, *, window=None, scale: float, logit_soft_cap: float | None = None, mesh=None):
    """Splash attention of q [B, T, kv, G, D] over k, v [B, T, kv, D] with `prepare`'s masks; [B, T, kv, G, D]."""
    batch, length, kv_heads, groups, head_dim = q.shape
    interpret = target_platform(mesh) == "cpu"
    dense = (q, k, v)  # for the XLA form
    # Splash does not scale the scores: scale the queries (in float32, then back to the compute dtype).
    q = jnp.transpose((q.astype(jnp.float32) * scale).astype(q.dtype), (0, 2, 3, 1, 4))  # [B, kv, G, T, D]
    k, v = (jnp.swapaxes(x, 1, 2) for x in (k, v))  # [B, kv, T, D]
    splash_masks = {name: x for name, x in masks.items() if name != "window_mask"}

    def run(window):
        def fn(q, k, v, masks):
            rows, local_kv = q.shape[:2]
            out = _splash_rows(q.reshape(rows, local_kv * groups, length, head_dim), k, v, masks, window=window,
                               logit_soft_cap=logit_soft_cap, interpret=interpret)
            return out.reshape(q.shape)
        return jnp.transpose(flash_common.per_shard(fn, q, k, v, splash_masks, mesh), (0, 3, 1, 2, 4))

    if not window:
        return run(None)
    if "window_mask" in masks:  # packed prompt groups' sliding layers: the XLA form (module docstring)
        def windowed():
            return xla.attend(*dense, (masks["window_mask"],) * 2, True, scale=scale,
                              logit_soft_cap=logit_soft_cap, mesh=mesh)
    else:
        windowed = functools.partial(run, window)
    if isinstance(sliding, bool):
        return windowed() if sliding else run(None)
    return jax.lax.cond(sliding, windowed, functools.partial(run, None))


def cache_state(q, cache_k, cache_v, layer, live, key_mask, sliding, *, window=None, scale: float,
                query_slot=None, mesh=None):
    """Online-softmax state (top, total [B, kv, G, T], out [B, kv, G, T, D]) of a decode step's queries
    q [B, T, kv, G, D] over layer `layer`'s live slots of one cache [L, R, kv, C, D] (the row cache, or a
    shared prefix read by B // R rows each), through `pallas_decode.cache_attention_state`.

    `key_mask` bool [R, C] says which slots hold keys; its first True slot per row is passed as the row's
    first valid slot, so left padding is never copied. A layer that slides (`sliding`, a bool or the layer
    scan's traced flag) reads only the last `window` slots before each query (`query_slot`: new token 0's
    slot, `live` by default); with a traced flag both kernels are traced, one runs (`lax.cond`).

    A cache whose rows the mesh's row shards do not divide (the sampler's prompt cache of 8 prompts on 16
    chips) cannot be split for the kernel: its state is `pallas_decode.xla_cache_attention_state`, the same
    state in XLA (one masked block over the capacity, as the decoder's own TPU form), partitioned by XLA.
    """
    valid_start = jnp.argmax(key_mask, axis=1).astype(jnp.int32)  # 0 for a row with no key: masked anyway
    if cache_k.shape[1] % batch_shards(mesh):
        state = pallas_decode.xla_cache_attention_state
    else:
        state = functools.partial(pallas_decode.cache_attention_state, mesh=mesh,
                                  interpret=target_platform(mesh) == "cpu")

    def run(window):
        return state(q, cache_k, cache_v, layer, live, scale, valid_start=valid_start, key_mask=key_mask,
                     window=window, query_slot=query_slot)

    return with_window(run, sliding, window)


def paged_state(q, pool_k, pool_v, tables, layer, lengths, starts, sliding, *, window=None, scale: float,
                query_positions=None, mesh=None):
    """Online-softmax state of a paged decode step's queries q [B, T, kv, G, D] over layer `layer`'s positions
    [starts, lengths) of each row of a paged pool [L, N, kv, S, D], read in place through the rows' block tables
    by `pallas_decode.paged_attention_state` (interpreted on a CPU). A layer that slides reads only the last
    `window` positions before each query, as `cache_state`."""
    state = functools.partial(pallas_decode.paged_attention_state, mesh=mesh, interpret=target_platform(mesh) == "cpu")
    return paged_at_windows(state, q, pool_k, pool_v, tables, layer, lengths, starts, sliding, window=window,
                            scale=scale, query_positions=query_positions)


IMPLEMENTATION = AttentionImplementation(
    name="pallas_tpu", platforms=("tpu", "cpu"), prepare=prepare, attend=attend,
    cache_state=cache_state, paged_state=paged_state, paged_writes_each=True)
