"""What the flash-attention implementations (`pallas_tpu`, `pallas_gpu`) share: the decoder's layouts as
calls with query and key segment ids, the exact union of two such calls, and running a kernel per shard.

A flash kernel sees a key when the query's and the key's segment ids are equal (and causality, and a
window, allow it). The layouts map onto that as:

* padded rows: ids 1 on real tokens and 0 on padding, so real queries see real keys only;
* packed segments: the segment ids themselves;
* packed prompt groups (models/packing.py), where a query sees its segment's trunk and its own branch:
  two disjoint key sets, each one call: its own (segment, branch) (the trunk's queries see the whole of
  what they may see there) and, for a branch's queries, their segment's trunk. `lse_union` merges the
  two calls exactly through their log-sum-exps, and differentiates the union as each call's flash
  backward run with the union's output and log-sum-exp (the union's probabilities), summed.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxgrpo.distributed import round_up
from jaxgrpo.models import remat
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.partitioning import activation_spec

# Segment ids of slots a kernel adds (to reach a multiple of its block, or rows to fill a shard) and of
# the trunk call's slots outside it: no real token has them, and a query id never equals a key id.
PAD_QUERY, PAD_KEY = -1, -2


def segment_ids(layout: AttentionLayout) -> dict[str, jax.Array]:
    """Query and key segment ids i32[B, T] of the calls a layout needs (module docstring): "query" and
    "key" for every layout, and "trunk_query" and "trunk_key" for packed prompt groups' trunk call."""
    if layout.kind == "padded":
        ids = layout.valid.astype(jnp.int32)
        return {"query": ids, "key": ids}
    segments = layout.segment_ids.astype(jnp.int32)
    if layout.kind == "segments":
        return {"query": segments, "key": segments}
    branches = layout.branch_ids.astype(jnp.int32)
    own = segments * (segments.shape[1] + 1) + branches  # one id per (segment, branch)
    real = segments != 0
    return {"query": own, "key": own,
            "trunk_query": jnp.where(real & (branches > 0), segments, PAD_QUERY),
            "trunk_key": jnp.where(real & (branches == 0), segments, PAD_KEY)}


def pad(x: jax.Array, axis: int, length: int, value=0) -> jax.Array:
    """`x` padded at the end of `axis` to `length` with `value`."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def lse_union(forward, backward):
    """Attention over the union of disjoint key sets, one flash call each, merged exactly, with its gradient.

    `forward(q, k, v, ids) -> (out, lse)` is one call over the keys that `ids` (a pytree of its segment
    ids) selects, `lse` its log-sum-exp with out's shape less the last axis; `backward(q, k, v, ids, out,
    lse, d_out, grad_dtype) -> (dq, dk, dv)` is that call's flash backward run with given `out` and `lse`,
    its gradients in `grad_dtype` where the kernel can choose: q's dtype for one call (so the kernel writes
    them as the model takes them: a float32 copy to convert afterwards is memory traffic), float32 for
    several, to be summed. The union of calls is out = sum_c exp(lse_c - lse) out_c with lse =
    logsumexp_c lse_c; its backward is each call's backward with the union's out and lse (so with the union's
    probabilities), summed. With one call this is the call itself. Returns `attention(q, k, v, [ids, ...]) ->
    out`, differentiable in q, k and v."""

    def merged(q, k, v, id_sets):
        calls = [forward(q, k, v, ids) for ids in id_sets]
        if len(calls) == 1:
            return calls[0]
        lse = functools.reduce(jnp.logaddexp, [part for _, part in calls])
        out = sum(jnp.exp(part - lse)[..., None] * o.astype(jnp.float32) for o, part in calls)
        return out.astype(q.dtype), lse

    @jax.custom_vjp
    def attention(q, k, v, id_sets):
        return merged(q, k, v, id_sets)[0]

    def attention_fwd(q, k, v, id_sets):
        out, lse = merged(q, k, v, id_sets)
        # Named for a remat policy that keeps the attention (`jaxgrpo.models.remat`): its backward then reads them
        # instead of rerunning the forward kernels.
        return out, (q, k, v, id_sets, remat.name(out, remat.ATTENTION), remat.name(lse, remat.ATTENTION))

    def attention_bwd(residuals, d_out):
        q, k, v, id_sets, out, lse = residuals
        dq, dk, dv = 0, 0, 0
        grad_dtype = q.dtype if len(id_sets) == 1 else jnp.float32
        for ids in id_sets:
            grads = backward(q, k, v, ids, out, lse, d_out, grad_dtype)
            dq, dk, dv = dq + grads[0], dk + grads[1], dv + grads[2]
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), jax.tree.map(lambda _: None, id_sets)

    attention.defvjp(attention_fwd, attention_bwd)
    return attention


def per_shard(fn, q, k, v, masks, mesh, heads_axis: int = 1):
    """`fn(q, k, v, masks)` run per shard of rows and key/value heads on `mesh` (as is without one), for
    q (5 axes) and k and v (4 axes), rows first and key/value heads at `heads_axis` ([B, kv, ...] or the model's
    [B, T, kv, ...]), and masks with a leading batch axis.

    A Pallas call cannot be partitioned by XLA, so on a mesh it always runs inside a `shard_map`: rows
    over the batch axes (padded with rows of `PAD_QUERY` ids to a multiple of their size when they do not
    divide, e.g. 4 packed rows on 8 chips), key/value heads with their query heads over `model` where it
    divides them."""
    logical = ["batch", None, None, None, None]
    logical[heads_axis] = "kv_heads"
    spec = None if mesh is None else activation_spec(tuple(logical), (q.shape[0] * mesh.size,) + q.shape[1:], mesh)
    if spec is None:
        return fn(q, k, v, masks)
    rows, heads = (None if axes is PartitionSpec.UNCONSTRAINED else axes for axes in (spec[0], spec[heads_axis]))
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    shards = math.prod(sizes[a] for a in ((rows,) if isinstance(rows, str) else rows or ()))
    batch = q.shape[0]
    padded = round_up(batch, shards)
    if padded != batch:
        q, k, v = (pad(x, 0, padded) for x in (q, k, v))
        masks = jax.tree.map(lambda x: pad(x, 0, padded, PAD_QUERY), masks)
    q_spec, kv_spec = ([rows] + [heads if axis == heads_axis else None for axis in range(1, n)] for n in (5, 4))
    q_spec, kv_spec = PartitionSpec(*q_spec), PartitionSpec(*kv_spec)
    mask_specs = jax.tree.map(lambda x: PartitionSpec(rows, *(None,) * (x.ndim - 1)), masks)
    out = jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, mask_specs), out_specs=q_spec,
                        check_vma=False)(q, k, v, masks)
    return out[:batch]
