"""Optimizer state stored in a narrower float type than it is computed in."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def stored_as(dtype, inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` with its floating-point state (e.g. Adam's two moments) kept in `dtype` between steps.

    Each update widens the stored state to float32, runs `inner` in float32, and rounds the new state to
    `dtype` (round to nearest even), so only storage is narrowed: bfloat16 halves the moments' memory,
    the trade MaxText and tunix offer for large models. Integer state (step counts) is kept as it is.
    """
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return inner

    def narrow(tree):
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def widen(tree):
        return jax.tree.map(lambda x: x.astype(jnp.float32) if x.dtype == dtype else x, tree)

    def init(params):
        return narrow(inner.init(params))

    def update(updates, state, params=None):
        updates, state = inner.update(updates, widen(state), params)
        return updates, narrow(state)

    return optax.GradientTransformation(init, update)
