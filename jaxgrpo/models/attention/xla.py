"""Attention as dense XLA operations: float32 scores [B, kv, G, T, T], masked, softmax, values.

The reference every other implementation is tested against. Memory grows with T^2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.models.attention import AttentionImplementation, AttentionLayout
from jaxgrpo.models.partitioning import constrain_activation

# Added to masked attention scores; finite so fully masked rows (padding queries) stay NaN-free.
MASKED_SCORE = -1e30


def build_attention_mask(
    query_slots: jax.Array,
    key_valid: jax.Array,
    window: int | None = None,
    query_segments: jax.Array | None = None,
    key_segments: jax.Array | None = None,
) -> jax.Array:
    """bool[B, T, S]: query at slot `query_slots[t]` may attend to key slot s.

    Causal in slot order, restricted to `key_valid` [B, S], to `query_slots[t] - s < window` when a
    window is given, and to equal segments when segment ids [B, T] / [B, S] are given.
    """
    key_slots = jnp.arange(key_valid.shape[1])
    distance = query_slots[:, None] - key_slots[None, :]
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    mask = allowed[None] & key_valid[:, None, :]
    if query_segments is not None:
        mask &= query_segments[:, :, None] == key_segments[:, None, :]
    return mask


def build_branch_mask(segment_ids: jax.Array, branch_ids: jax.Array, positions: jax.Array, window: int | None = None) -> jax.Array:
    """bool[B, T, T] of packed prompt groups: causal in slot order within a segment (id 0 is padding),
    a key visible if it is in the shared trunk (branch 0) or in the query's own branch, and, with a
    window, fewer than `window` positions back (branches do not continue the trunk's slots)."""
    slots = jnp.arange(segment_ids.shape[1])
    mask = (slots[:, None] >= slots[None, :])[None]
    mask &= (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids != 0)[:, None, :]
    mask &= (branch_ids[:, None, :] == 0) | (branch_ids[:, :, None] == branch_ids[:, None, :])
    if window is not None:
        mask &= positions[:, :, None] - positions[:, None, :] < window
    return mask


def prepare(layout: AttentionLayout, positions: jax.Array, window: int | None) -> tuple[jax.Array, jax.Array]:
    """(full mask, sliding-window mask) bool[B, T, T]; the same array twice without a window."""
    if layout.kind == "branches":
        masks = [build_branch_mask(layout.segment_ids, layout.branch_ids, positions, w) for w in (None, window)]
    else:
        length = positions.shape[1]
        if layout.kind == "segments":
            key_valid, segments = layout.segment_ids != 0, (layout.segment_ids, layout.segment_ids)
        else:
            key_valid, segments = layout.valid, (None, None)
        masks = [build_attention_mask(jnp.arange(length), key_valid, w, *segments) for w in (None, window)]
    return (masks[0], masks[1]) if window else (masks[0], masks[0])


def attend(q, k, v, masks, sliding, *, window=None, scale: float, logit_soft_cap: float | None = None, mesh=None):
    """softmax(mask(cap(scale q.k))) v, out [B, T, kv, G, D] in q's dtype (module docstring of the package).

    With `logit_soft_cap` c the scores become c tanh(s / c) before masking (Gemma 2's attention soft-capping).
    """
    del window  # in the masks already
    full_mask, sliding_mask = masks
    mask = jnp.where(sliding, sliding_mask, full_mask)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    if logit_soft_cap is not None:
        scores = logit_soft_cap * jnp.tanh(scores / logit_soft_cap)
    scores = constrain_activation(scores, ("batch", "kv_heads", None, None, None), mesh)
    scores = jnp.where(mask[:, None, None], scores, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


IMPLEMENTATION = AttentionImplementation(
    name="xla", platforms=("cpu", "gpu", "tpu"), prepare=prepare, attend=attend)
