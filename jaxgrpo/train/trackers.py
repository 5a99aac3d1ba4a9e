"""Stateful kernels: a state per prompt of the dataset, kept in the train state across steps.

A tracker stage (`cfg.value_tracker`) names a registered kernel `state, prompt_ids, rewards, kl -> state`.
Its state lives in `TrainState.kernel_state`, so a checkpoint holds it and a resumed run continues
bit for bit. Each step:

1. the advantage stage reads `baseline`, the tracked value of each row's prompt (before this step's
   outcomes: SPO's advantage is r - v(x), v from earlier steps only);
2. after the update, the tracker folds in the step's outcomes, forgetting faster where the policy moved:
   `kl` of a row is the k3 estimate of KL(pi_old || pi_new) on its tokens, pi_old the policy that sampled
   it and pi_new the one the update produced (the drift since the prompt's value was last informed).

`TRACKERS` says how each tracker kernel's state starts and what value it tracks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import kernels
from jaxgrpo.distributed import gather_rows
from jaxgrpo.kernels.segments import masked_mean

if TYPE_CHECKING:  # a type only: the config validates its stages (`check_config`), not the other way round
    from jaxgrpo.config.fields import Config

#: The key of the training examples holding their position in the training split (added when tracking).
PROMPT_INDEX = "prompt_index"


class Tracker(NamedTuple):
    """How a stateful kernel's state starts and what per-prompt value it tracks."""

    init: Callable  # (num_prompts) -> state pytree
    value: Callable  # state -> f32[P]


def _spo():
    from jaxgrpo.kernels import selection

    return Tracker(init=lambda num_prompts: selection.spo_tracker_init(num_prompts), value=lambda s: s.value)


#: Tracker kernels by registry name.
TRACKERS: dict[str, Callable[[], Tracker]] = {"experimental/spo_value_tracker": _spo}


def indexed(examples: list[dict]) -> list[dict]:
    """The training examples with their position under `PROMPT_INDEX`: the tracker's prompt ids."""
    return [{**e, PROMPT_INDEX: i} for i, e in enumerate(examples)]


def prompt_ids(examples: list[dict]) -> np.ndarray:
    """i32[N] the whole batch's prompts as positions in the training split, from this host's rows' examples."""
    return gather_rows(np.array([e[PROMPT_INDEX] for e in examples], np.int32))


def init_state(cfg: Config, num_prompts: int) -> dict:
    """The kernel state at step 0: {stage: state} for the configured tracker ({} without one)."""
    if cfg.value_tracker is None:
        return {}
    return {"value_tracker": TRACKERS[cfg.value_tracker]().init(num_prompts)}


def baseline(cfg: Config, kernel_state: dict, prompt_ids: np.ndarray) -> np.ndarray:
    """f32[N] the tracked value of each row's prompt."""
    values = TRACKERS[cfg.value_tracker]().value(kernel_state["value_tracker"])
    return np.asarray(values, np.float32)[prompt_ids]


def drift(sampler_logp: np.ndarray, new_logp: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """f32[N] per row: the mean over its tokens of k3, an estimate of KL(pi_old || pi_new) from pi_old's samples."""
    k3 = kernels.kl_penalty(jnp.asarray(sampler_logp), jnp.asarray(new_logp), "k3", mask=jnp.asarray(mask))
    return np.asarray(masked_mean(k3, jnp.asarray(mask), axis=-1), np.float32)


def update(cfg: Config, kernel_state: dict, prompt_ids, correct, kl, valid) -> dict:
    """The kernel state after folding in one step's outcomes (0/1 correctness, as SPO's Beta tracker reads)."""
    tracker = kernels.get("selection", cfg.value_tracker)
    state = kernel_state["value_tracker"]
    new = tracker(state, jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(correct, jnp.float32),
                  jnp.asarray(kl, jnp.float32), valid=jnp.asarray(valid), **cfg.value_tracker_kwargs)
    # Keep each leaf's layout (replicated on the mesh), so the jitted update sees one input type.
    new = jax.tree.map(lambda n, o: jax.device_put(n, o.sharding), new, state)
    return {**kernel_state, "value_tracker": new}
