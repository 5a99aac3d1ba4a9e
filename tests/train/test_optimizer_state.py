"""Optimizer state stored in bfloat16: the same steps as float32 moments within bfloat16's rounding, half
the bytes, integer state untouched; an unknown state dtype gets a one-line error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import train
from jaxgrpo.config import Config, OptimizerConfig, validate


def _run(state_dtype: str, steps: int = 5):
    optimizer = train.make_optimizer(OptimizerConfig(lr=1e-2, warmup_steps=2, weight_decay=0.01,
                                                       state_dtype=state_dtype))
    keys = jax.random.split(jax.random.key(0), steps + 1)
    params = {"w": jax.random.normal(keys[0], (64, 32)), "b": jnp.zeros((32,))}
    state = optimizer.init(params)
    for key in keys[1:]:
        grads = jax.tree.map(lambda p, k=key: jax.random.normal(k, p.shape) + 0.1 * p, params)
        updates, state = optimizer.update(grads, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params, state


def test_bfloat16_moments_step_like_float32_ones_in_half_the_bytes():
    params32, state32 = _run("float32")
    params16, state16 = _run("bfloat16")
    floats32 = [x for x in jax.tree.leaves(state32) if jnp.issubdtype(x.dtype, jnp.floating)]
    floats16 = [x for x in jax.tree.leaves(state16) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats16 and all(x.dtype == jnp.bfloat16 for x in floats16)
    assert sum(x.nbytes for x in floats16) * 2 == sum(x.nbytes for x in floats32)
    # Step counts stay integers and count the same.
    ints = lambda s: [int(x) for x in jax.tree.leaves(s) if jnp.issubdtype(x.dtype, jnp.integer)]  # noqa: E731
    assert ints(state16) == ints(state32) == [5] * len(ints(state32)) and ints(state32)
    # Five Adam steps of lr 1e-2 move each weight by up to 5e-2; the moments' bfloat16 rounding (a relative
    # 2^-9 per step) changes a step by well under 1% of that.
    moved = np.abs(np.asarray(params32["w"]) - np.asarray(_run("float32", 0)[0]["w"])).max()
    assert moved > 1e-2
    for name in params32:
        np.testing.assert_allclose(params16[name], params32[name], atol=5e-4, rtol=0)
    # bfloat16 storage changes something (this test would pass vacuously if the state were float32).
    assert not np.array_equal(np.asarray(params16["w"]), np.asarray(params32["w"]))


def test_unknown_state_dtype_gets_a_one_line_error():
    cfg = Config()
    cfg.optimizer.state_dtype = "float16"
    with pytest.raises(ValueError, match=r"optimizer.state_dtype must be one of float32, bfloat16, got 'float16'"):
        validate(cfg)
