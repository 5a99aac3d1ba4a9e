"""From a scored rollout to the update's `TrainBatch`: the host stages, the rows that train, reference log-probs, GAE.

The host stages (reward shaping, advantage, token credit, row weights: `jaxgrpo.train.stages`) run on
the whole batch's fields (`BatchInputs`, gathered from every host), so every host computes the same
advantages and keeps its own rows'.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import kernels, rng
from jaxgrpo.config import Config
from jaxgrpo.distributed import across_processes, gather_rows, process_block
from jaxgrpo.models import packing
from jaxgrpo.models.decoder import mask_positions
from jaxgrpo.train import inputs as inputs_lib, stages
from jaxgrpo.train.rollout import RowStats, Trajectories, completion_valid, row_stats
from jaxgrpo.train.step import TrainBatch

class Scorers(NamedTuple):
    """The forwards `train_batch` may run, each `(tokens, attention, positions, completion_len)` -> f32[n, C] for
    this host's rows (only those the config needs are called)."""

    reference: Callable  # the KL reference's log-probs (a KL term)
    policy: Callable  # the current policy's log-probs (a stage reading `trainer_logp`)
    values: Callable  # the value head's values (an advantage reading them: `Config.value_head`)


#: Task-provided per-row ids: the field, and the key of the task's examples that holds it.
TASK_IDS = {"strata_ids": "strata_id", "bundle_ids": "bundle_id"}


def whole_steps(steps: inputs_lib.Steps | None, rows: int) -> inputs_lib.Steps | None:
    """The whole batch's `Steps` from this host's (of its `rows` episode rows), gathered from every host: step rows
    offset to the whole batch's, anchor ids numbered on after the hosts before (GiGPO groups steps by group and
    anchor, and a group's episodes are one host's)."""
    if steps is None or jax.process_count() == 1:
        return steps
    sizes = across_processes(np.array([len(steps.rows), int(steps.anchor_ids.max(initial=-1)) + 1])).astype(int)
    counts, anchors = sizes[:, 0], sizes[:, 1]  # each host's steps and anchors
    here, most = jax.process_index(), int(counts.max())
    # A step is four int32 words (its return's float32 bits the last), so one exchange gathers them.
    words = np.full((most, 4), -1, np.int32)
    words[:len(steps.rows)] = np.stack([steps.rows + here * rows, steps.turns, steps.anchor_ids + anchors[:here].sum(),
                                        steps.step_returns.astype(np.float32).view(np.int32)], axis=1)
    # Every host's steps (padded to `most` each) and its rows' token turns.
    whole = gather_rows({"steps": words, "token_turns": steps.token_turns})
    keep = np.concatenate([np.arange(count) + p * most for p, count in enumerate(counts)])
    words = whole["steps"][keep]
    return inputs_lib.Steps(words[:, 0], words[:, 1], np.ascontiguousarray(words[:, 3]).view(np.float32), words[:, 2],
                            whole["token_turns"])


def batch_inputs(cfg: Config, rollout: Trajectories, stats: RowStats, reward_weights: np.ndarray,
                 tokens: dict[str, np.ndarray], rows: dict | None = None) -> inputs_lib.BatchInputs:
    """The whole batch's fields from this host's rollout, the whole batch's `RowStats` and this host's
    token fields `tokens` (gathered here: only the ones the host stages read are passed); `rows`: more
    whole-batch row fields by name (e.g. a tracker's `baseline`)."""
    local = {name: np.array([e[key] for e in rollout.examples], np.int32)
             for name, key in TASK_IDS.items() if rollout.examples and all(key in e for e in rollout.examples)}
    whole = gather_rows({**local, **tokens}) if local or tokens else {}
    return inputs_lib.BatchInputs(
        rewards=stats.rewards, reward_columns=np.stack(list(stats.per_reward.values()), axis=-1),
        reward_weights=np.asarray(reward_weights, np.float32), correct=stats.correct, group_ids=stats.group_ids,
        num_groups=cfg.prompts_per_step, valid=stats.trains, lengths=stats.lengths.astype(np.float32),
        seq_logp=stats.seq_logp, mask=whole.get("mask"), sampler_logp=whole.get("sampler_logp"),
        trainer_logp=whole.get("trainer_logp"), values=whole.get("values"),
        task_ids={**{name: whole[name] for name in local}, **(rows or {})},
        steps=whole_steps(rollout.steps, len(rollout.rewards)),
    )


def gae_advantages(cfg: Config, rollout: Trajectories, mask: np.ndarray, valid: np.ndarray, old_logp, ref_logp, old_values):
    """PPO's (advantages, returns) f32[n, C]: the advantage stage's GAE over the value head, whitened over the whole
    batch's tokens.

    The reward sits on each row's last completion token, minus the KL to the reference per token with a KL term.
    """
    token_rewards = np.zeros_like(mask)
    last = np.maximum(mask.sum(-1).astype(np.int32) - 1, 0)
    token_rewards[np.arange(len(last)), last] = rollout.rewards * valid
    if cfg.kl_coef:
        token_rewards = token_rewards - cfg.kl_coef * (old_logp - ref_logp) * mask
    gae = stages.kernel_of(cfg, stages.STAGE["advantage"])  # `gae`: (advantages, returns)
    adv, returns = gae(jnp.asarray(token_rewards), jnp.asarray(old_values), jnp.asarray(mask), **cfg.advantage_kwargs)
    whole = gather_rows({"adv": np.asarray(adv), "mask": mask})  # the per-token advantages of every host
    advantages = np.asarray(kernels.masked_whiten(jnp.asarray(whole["adv"]), jnp.asarray(whole["mask"])))
    return advantages[process_block(len(advantages))], np.asarray(returns)


def train_batch(cfg: Config, rollout: Trajectories, reward_weights: np.ndarray, scorers: Scorers,
                stats: RowStats | None = None, rows: dict | None = None, metrics: dict | None = None) -> TrainBatch:
    """The arrays the jitted update consumes for this host's rows of `rollout`.

    `scorers`: the forwards the config needs (`Scorers`). `stats`: the whole batch's
    `gather_rows(row_stats(rollout))`, if the caller already has it.
    `rows`: more whole-batch row fields the host stages may read (`batch_inputs`). The stages' kernels' scalar
    metrics go into `metrics` when given.
    """
    stages.check_behaviour_logprobs(cfg, rollout.sampler_logp is not None)
    if stats is None:
        stats = gather_rows(row_stats(rollout))
    tokens = np.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1).astype(np.int32)
    attention = np.concatenate([rollout.prompt_mask, completion_valid(rollout)], axis=1)
    positions = mask_positions(attention)
    valid = rollout.trains
    if cfg.loss_mask:
        keep = kernels.get("mask", cfg.loss_mask)(
            jnp.asarray(stats.rewards), jnp.asarray(stats.group_ids), num_groups=cfg.prompts_per_step,
            valid=jnp.asarray(stats.trains), **cfg.loss_mask_kwargs)
        valid = valid & np.asarray(keep)[process_block(len(stats.rewards))]
    mask = rollout.completion_mask * valid[:, None]
    forward_args = (tokens, attention, positions, mask.shape[1])
    # One-step-off (max_staleness >= 1): the sampling policy is an update behind the learner, so the PPO ratio is
    # taken against the learner's own log-probs before the update (decoupled PPO; verl recomputes them alike),
    # and the sampler's stay the behaviour's, which a correction stage reads (`sampler_logp`).
    # Trajectories without behaviour log-probs (sampled elsewhere) are anchored at the learner's alike.
    learner_anchor = cfg.max_staleness or rollout.sampler_logp is None
    trainer_logp = scorers.policy(*forward_args) if learner_anchor else None
    old_logp = rollout.sampler_logp if trainer_logp is None else trainer_logp
    zeros = np.zeros_like(mask)
    ref_logp, returns, old_values = zeros, zeros, zeros
    if cfg.kl_coef:
        ref_logp = scorers.reference(*forward_args)
    if cfg.value_head:
        old_values = scorers.values(*forward_args)
        token_advantages, returns = gae_advantages(cfg, rollout, mask, valid, old_logp, ref_logp, old_values)
    else:
        read = stages.token_fields_read(cfg) | ({"mask"} if "token_rewards" in stages.token_fields_read(cfg) else set())
        if trainer_logp is None and "trainer_logp" in read:
            trainer_logp = scorers.policy(*forward_args)
        local_tokens = {"mask": mask, "sampler_logp": rollout.sampler_logp, "trainer_logp": trainer_logp}
        inputs = batch_inputs(cfg, rollout, stats, reward_weights, {k: v for k, v in local_tokens.items() if k in read},
                              rows)
        token_advantages = stages.token_advantages(cfg, inputs, mask.shape[1], metrics)[
            process_block(len(stats.rewards))]
    row_fields = {}
    loss_reads = set(sum(inputs_lib.fields_read(kernels.get_loss(cfg.loss), cfg.loss_kwargs), []))
    for name in inputs_lib.LOSS_ROW_FIELDS:
        if name in loss_reads:
            row_fields[name] = {"rewards": rollout.rewards.astype(np.float32), "group_ids": rollout.group_ids,
                                "valid": valid}[name]
    return TrainBatch(tokens, attention, positions, mask.astype(np.float32), old_logp.astype(np.float32),
                      np.asarray(token_advantages, np.float32), np.asarray(ref_logp, np.float32),
                      np.asarray(returns, np.float32), np.asarray(old_values, np.float32), row_fields)


class PackedTrees(NamedTuple):
    """How a step's batch packs (`cfg.packing`): rows per packed tree (a whole group where every group's rows hold
    one prompt on every host, `packing.shares_prompts`, else one row) and the slots each tree of the whole batch
    needs (`packing.group_lengths`)."""

    size: int
    lengths: np.ndarray


def packed_trees(cfg: Config, batch: TrainBatch) -> PackedTrees | None:
    """The batch's `PackedTrees` (this host's rows; every host gets the same), or None without `cfg.packing`."""
    if not cfg.packing:
        return None
    tokens, attention = np.asarray(batch.tokens), np.asarray(batch.attention_mask)
    completion_len = batch.completion_mask.shape[-1]
    shared = across_processes(np.bool_(packing.shares_prompts(tokens, attention, completion_len, cfg.group_size)))
    size = cfg.group_size if np.all(shared) else 1
    local = packing.group_lengths(attention, np.asarray(batch.completion_mask), completion_len, size)
    return PackedTrees(size, gather_rows(local.astype(np.int32)))


def minibatches(cfg: Config, num_rows: int, step: int, trees: PackedTrees | None, attention_scale):
    """The rows i32[micro_batches, micro], packed shape and packing layout of each of a step's minibatches.

    Epoch after the first (and every epoch with several minibatches) shuffles whole groups, each group's
    rows in order, with the step's "minibatches" generator (`jaxgrpo.rng`). The packed shape (rows, length,
    rows per tree) is None without packing (`trees` None).
    """
    minibatch = num_rows // cfg.num_minibatches
    micro = cfg.micro_batch_size or minibatch
    order_rng = rng.generator(rng.stream(rng.run_key(cfg.seed), "minibatches", step))
    for epoch in range(cfg.num_epochs):
        order = np.arange(num_rows)
        if epoch or cfg.num_minibatches > 1:
            g = cfg.group_size
            order = (order_rng.permutation(num_rows // g)[:, None] * g + np.arange(g)).ravel()
        for m in range(cfg.num_minibatches):
            rows = order[m * minibatch : (m + 1) * minibatch]
            packed_shape, layout = None, ()
            if trees is not None:
                rows, plan = packing.plan_rows(rows, trees.lengths, trees.size, micro, attention_scale=attention_scale)
                packed_shape, layout = (plan.rows, plan.length, trees.size), ((plan.group_rows, plan.group_offsets),)
            yield rows.reshape(minibatch // micro, micro), packed_shape, layout


def rows_with_signal(batch: TrainBatch) -> np.ndarray:
    """bool[n]: the rows of (this host's) batch that train with a non-zero advantage on some token: the rows the
    policy-gradient term learns from."""
    return np.any((np.asarray(batch.advantages) != 0) & (np.asarray(batch.completion_mask) > 0), axis=-1)
