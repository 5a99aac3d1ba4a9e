"""Aggregation: per-token losses to a scalar, exactly across micro-batches and devices.

Each mode is a ratio `total / denominator` of two sums over sequences::

    token_mean               sum_{i,t} l m / sum_{i,t} m           (DAPO)
    seq_mean_token_mean      sum_i [sum_t l m / sum_t m] / N_seq   (GRPO)
    seq_mean_token_sum       sum_{i,t} l m / N_seq
    seq_mean_token_sum_norm  sum_{i,t} l m / (N_seq * max_len)     (Dr. GRPO)
    token_sum                sum_{i,t} l m / 1                     (verl's token-sum)

`N_seq` counts sequences with at least one unmasked token. Because both the
numerator and the denominator are sums over sequences, the parts of
micro-batches (or devices) add up to the parts of the full batch; `token_sum`
has the constant denominator 1 (no normalization at all), so its totals add up
while its denominator stays 1 for the full batch, which is what
`aggregation_denominator` gives and `aggregate` divides each micro-batch by. For gradient
accumulation, compute the full batch's denominator first
(`aggregation_denominator`) and pass it to `aggregate` for each micro-batch:
the micro-batch losses, and their gradients, then sum to the full-batch ones.

Masked-out tokens are selected away (`where`, not a multiplication by the
mask), so a NaN or inf per-token loss there changes neither the loss nor its
gradient.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxgrpo.kernels.validation import check_token_inputs

Array = jax.Array

AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_sum")


class LossParts(NamedTuple):
    """A loss as `total / denominator`; parts of disjoint batches add up."""

    total: Array
    denominator: Array

    def __add__(self, other: "LossParts") -> "LossParts":  # type: ignore[override]
        return LossParts(self.total + other.total, self.denominator + other.denominator)

    @property
    def value(self) -> Array:
        return self.total / jnp.maximum(self.denominator, jnp.finfo(jnp.float32).tiny)


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATION_MODES)}")


def aggregation_denominator(mask, mode: str = "token_mean", *, max_len: int | None = None) -> Array:
    """The denominator of `mode` for a batch; depends on the mask only, not on the loss.

    Args:
      mask: f32[N, T] (or bool) token mask.
      mode: one of `AGGREGATION_MODES`.
      max_len: the constant length of `seq_mean_token_sum_norm` (Dr. GRPO's
        L_max, e.g. the maximum completion length); defaults to T.
    """
    _check_mode(mode)
    mask = jnp.asarray(mask, jnp.float32)
    if mask.ndim != 2:
        raise ValueError(f"mask must have shape [N, T], got shape {mask.shape}")
    if mode == "token_mean":
        return mask.sum()
    if mode == "token_sum":
        return jnp.ones((), jnp.float32)  # a plain sum: the same constant for a micro-batch and the full batch
    num_seqs = (mask.sum(-1) > 0).astype(jnp.float32).sum()
    if mode == "seq_mean_token_sum_norm":
        length = mask.shape[-1] if max_len is None else max_len
        if isinstance(length, bool) or not isinstance(length, numbers.Real) or length <= 0:
            raise ValueError(f"max_len must be a positive number, got {max_len!r}")
        return num_seqs * float(length)
    return num_seqs


def aggregation_parts(per_token_loss, mask, mode: str = "token_mean", *, max_len: int | None = None) -> LossParts:
    """`(total, denominator)` of `mode` for one batch or micro-batch."""
    _check_mode(mode)
    check_token_inputs(per_token_loss=per_token_loss, mask=jnp.asarray(mask, jnp.float32))
    mask = jnp.asarray(mask, per_token_loss.dtype)
    masked = jnp.where(mask > 0, per_token_loss, 0.0) * mask
    if mode == "seq_mean_token_mean":
        lengths = mask.sum(-1)
        total = (masked.sum(-1) / jnp.maximum(lengths, 1)).sum()
    else:
        total = masked.sum()
    return LossParts(total, aggregation_denominator(mask, mode, max_len=max_len))


def aggregate(
    per_token_loss,
    mask,
    mode: str = "token_mean",
    *,
    max_len: int | None = None,
    denominator: Array | float | None = None,
) -> tuple[Array, LossParts]:
    """Aggregates per-token losses into a scalar loss.

    Args:
      per_token_loss: f32[N, T].
      mask: f32[N, T] (or bool), 1 for tokens that count.
      mode: one of `AGGREGATION_MODES`.
      max_len: L_max of `seq_mean_token_sum_norm`; defaults to T.
      denominator: the denominator of the *full* batch when this call sees one
        micro-batch of it (see `aggregation_denominator`); defaults to this
        batch's own.

    Returns:
      `(loss, parts)`: the scalar `parts.total / denominator`, and this batch's
      `LossParts` (which add up across micro-batches and devices).
    """
    parts = aggregation_parts(per_token_loss, mask, mode, max_len=max_len)
    denom = parts.denominator if denominator is None else jnp.asarray(denominator, parts.total.dtype)
    return parts.total / jnp.maximum(denom, jnp.finfo(jnp.float32).tiny), parts
