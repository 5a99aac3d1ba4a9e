"""Input checks shared by the kernels.

Shape and dtype checks run at trace time and raise errors that name the
argument and the expected shape. Value checks (e.g. `group_ids` in range) run
only when the array is concrete (eager use): an error. Under `jax.jit` values
are unknown, so a row whose group id lies outside [0, num_groups) is treated
as invalid instead (`check_group_ids`): it enters no group's statistics and
gets what an invalid row gets (advantage 0), so it cannot change the other
rows' results. Count such rows with `out_of_range_group_ids` (jittable) to
log them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def is_concrete(x: Any) -> bool:
    """Whether `x` has known values (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def _shape(x) -> tuple[int, ...]:
    return tuple(np.shape(x))


def check_floating(name: str, x) -> Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    return x


def check_integer(name: str, x) -> Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {x.dtype}")
    return x


def check_rank(name: str, x, rank: int | tuple[int, ...], what: str) -> None:
    ranks = (rank,) if isinstance(rank, int) else rank
    if np.ndim(x) not in ranks:
        raise ValueError(f"{name} must have shape {what}, got shape {_shape(x)}")


def check_same_shape(name: str, x, ref_name: str, ref) -> None:
    if _shape(x) != _shape(ref):
        raise ValueError(f"{name} has shape {_shape(x)} but {ref_name} has shape {_shape(ref)}; they must match")


def check_num_groups(num_groups: Any) -> int:
    if isinstance(num_groups, (bool, np.bool_)) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive Python int (it fixes the output shape), got {num_groups!r}")
    return int(num_groups)


def out_of_range_group_ids(group_ids, num_groups: int) -> Array:
    """bool[N]: the rows whose group id lies outside [0, num_groups) (jittable; e.g. log `.sum()`)."""
    group_ids = jnp.asarray(group_ids)
    return (group_ids < 0) | (group_ids >= num_groups)


def check_group_ids(group_ids, num_groups: int) -> tuple[Array, Array]:
    """(group ids as int32 with out-of-range ones replaced by 0, bool[N] of the rows whose id is in range).

    Eager (concrete ids): an id outside [0, num_groups) is a ValueError naming the range. Under jit the
    caller treats the rows not in range as invalid: a segment reduction drops an out-of-range id, but a
    gather clips it to the nearest group and a sort by group id mixes it into the others, which would
    change in-range rows' results silently.
    """
    if is_concrete(group_ids) and np.size(group_ids):
        # numpy, not jnp: under jit a closed-over concrete array stays concrete,
        # but jnp.min of it is staged out as a tracer and int() would fail.
        ids = np.asarray(group_ids)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_groups:
            raise ValueError(
                f"group_ids must lie in [0, num_groups={num_groups}), got values in [{lo}, {hi}]"
            )
    group_ids = jnp.asarray(group_ids).astype(jnp.int32)
    in_range = ~out_of_range_group_ids(group_ids, num_groups)
    return jnp.where(in_range, group_ids, 0), in_range


def check_outcome_inputs(rewards, group_ids, num_groups, valid, *, reward_shape: str = "[N]"):
    """Validates the outcome-estimator arguments and returns them as arrays.

    A row whose reward is NaN or +-inf (any of its K rewards, for [N, K]) is
    invalid, as if `valid` were False there: every estimator then leaves it out
    of its group's statistics and gives it 0, so one bad reward does not turn
    its group's advantages into NaN. The rewards of invalid rows are returned
    as 0, so they never reach arithmetic (nor a gradient). So is a row whose
    group id is out of range under jit (eager, that is an error; `check_group_ids`).

    Returns:
      (rewards, group_ids as int32, valid as bool[N], num_groups as int).
    """
    rewards = check_floating("rewards", rewards)
    check_rank("rewards", rewards, 1 if reward_shape == "[N]" else 2, reward_shape)
    n = rewards.shape[0]
    group_ids = check_integer("group_ids", group_ids)
    if group_ids.ndim != 1 or group_ids.shape[0] != n:
        raise ValueError(
            f"group_ids must have shape [N]=[{n}] like rewards' first axis, got shape {_shape(group_ids)}"
        )
    num_groups = check_num_groups(num_groups)
    group_ids, in_range = check_group_ids(group_ids, num_groups)
    finite = jnp.isfinite(rewards)
    finite = finite if finite.ndim == 1 else finite.all(axis=1)
    valid = check_valid("valid", valid, n) & finite & in_range
    rewards = jnp.where(valid.reshape(valid.shape + (1,) * (rewards.ndim - 1)), rewards, 0)
    return rewards, group_ids, valid, num_groups


def check_valid(name: str, valid, n: int) -> Array:
    """A bool[N] mask; None means every row is valid."""
    if valid is None:
        return jnp.ones((n,), dtype=bool)
    valid = jnp.asarray(valid)
    if valid.shape != (n,):
        raise ValueError(f"{name} must have shape [N]=[{n}], got shape {_shape(valid)}")
    if valid.dtype != jnp.bool_:
        if not (jnp.issubdtype(valid.dtype, jnp.integer) or jnp.issubdtype(valid.dtype, jnp.floating)):
            raise TypeError(f"{name} must be a bool array, got dtype {valid.dtype}")
        valid = valid != 0
    return valid


def check_token_inputs(**arrays) -> None:
    """Checks that named [N,T] arrays are floating and share one shape.

    The first keyword sets the reference shape. None values are skipped.
    """
    items = [(k, v) for k, v in arrays.items() if v is not None]
    ref_name, ref = items[0]
    check_rank(ref_name, ref, 2, "[N, T]")
    for name, x in items:
        check_floating(name, x)
        check_same_shape(name, x, ref_name, ref)


def broadcast_advantages(advantages, logp) -> Array:
    """Advantages f32[N] or f32[N,T] as f32[N,T] aligned with `logp`."""
    advantages = check_floating("advantages", advantages)
    n, t = _shape(logp)
    if advantages.ndim == 1:
        if advantages.shape[0] != n:
            raise ValueError(f"advantages has {advantages.shape[0]} rows but logp has {n}; expected [N]=[{n}] or [N, T]=[{n}, {t}]")
        return jnp.broadcast_to(advantages[:, None], (n, t))
    if advantages.shape != (n, t):
        raise ValueError(f"advantages must have shape [N]=[{n}] or [N, T]=[{n}, {t}], got {_shape(advantages)}")
    return advantages
