"""The GRPO loop: sample -> reward -> advantage -> loss -> update.

The trainer composes registered kernels; it holds no method-specific math.
One training step:

1. sample `group_size` completions for each of `prompts_per_step` prompts with
   the current policy (`jaxgrpo.sampler`), optionally resampling until enough
   groups carry signal (DAPO dynamic sampling);
2. score them with the task's reward functions (host side, any Python);
3. compute advantages with the registered estimator (`cfg.advantage`), or GAE
   with a value head (`cfg.value_head`);
4. for `num_epochs` x `num_minibatches`, call one jitted `update` that computes
   the registered policy loss (`cfg.loss`) plus optional KL and entropy terms,
   accumulates exact gradients over micro-batches (the aggregation's
   full-minibatch denominator is computed first), and applies the optax update.
   With `cfg.packing` (the default) each micro-batch is scored as packed prompt
   groups (`jaxgrpo.models.packing`): a prompt once, its completions without
   padding, rows that do not train left out; the log-probs are the same.

`update` is a pure function of `(TrainState, minibatch, packing layout)` with the state donated
and explicit shardings on the mesh; Python loops live outside jit.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo import kernels, sampler
from jaxgrpo.config import DTYPES, Config, OptimizerConfig, validate
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.models import packing
from jaxgrpo.models.logprobs import token_logprobs_and_entropy
from jaxgrpo.models.partitioning import shard_model
from jaxgrpo.optimizer_state import stored_as

Array = jax.Array
logger = logging.getLogger(__name__)

#: Mesh axes the batch is split over (the model axis holds tensor-parallel shards).
BATCH_AXES = ("data", "fsdp")


# -- the policy -----------------------------------------------------------------------


class ValueHead(nnx.Module):
    """A scalar value per token from the policy's final hidden states (PPO critic)."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jnp.zeros((hidden_size, 1), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((1,), jnp.float32))

    def __call__(self, hidden: Array) -> Array:
        return (hidden.astype(jnp.float32) @ self.kernel[...] + self.bias[...])[..., 0]


class Policy(nnx.Module):
    """The decoder being trained, with an optional value head."""

    def __init__(self, decoder: nnx.Module, *, value_head: bool = False, rngs: nnx.Rngs | None = None):
        self.decoder = decoder
        self.value_head = ValueHead(decoder.config.hidden_size, rngs=rngs or nnx.Rngs(0)) if value_head else None


class TrainState(NamedTuple):
    """Everything that changes during training (a pytree; donated to `update`)."""

    params: Any
    opt_state: Any
    step: Array


class TrainBatch(NamedTuple):
    """One minibatch as the jitted update sees it; every leaf has a leading [micro_batches, micro] shape."""

    tokens: Array  # i32[..., L] prompt (left padded) + completion
    attention_mask: Array  # bool[..., L]
    positions: Array  # i32[..., L]
    completion_mask: Array  # f32[..., C]
    old_logp: Array  # f32[..., C] log-probs of the sampling policy
    advantages: Array  # f32[..., C]
    ref_logp: Array  # f32[..., C] (zeros without a KL term)
    returns: Array  # f32[..., C] (zeros without a value head)
    old_values: Array  # f32[..., C] (zeros without a value head)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up, after global-norm clipping, its moments stored in `cfg.state_dtype`."""
    schedule = (
        optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps) if cfg.warmup_steps > 0 else optax.constant_schedule(cfg.lr)
    )
    return stored_as(cfg.state_dtype, optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    ))


def completion_outputs(policy: Policy, tokens, attention_mask, positions, completion_len: int, temperature: float, *, with_values: bool):
    """Per-token log-probs, entropies (and values) of the last `completion_len` tokens.

    The hidden state at position t predicts token t + 1, so the completion's
    tokens are scored from the hidden states just before them. Log-probs are
    computed in vocabulary chunks (never materializing [B, C, V] float32 logits).
    """
    decoder = policy.decoder
    hidden, _ = decoder.hidden_states(tokens, positions, attention_mask=attention_mask)
    prompt_len = tokens.shape[1] - completion_len
    hidden = hidden[:, prompt_len - 1 : -1]
    logp, entropy = token_logprobs_and_entropy(
        hidden, decoder.unembedding(), tokens[:, prompt_len:], temperature=temperature,
        logit_softcap=decoder.config.final_logit_softcapping,
    )
    values = policy.value_head(hidden) if with_values else None
    return logp, entropy, values


def _weighted_metrics(metrics: dict, weight: Array) -> dict:
    return {k: v * weight for k, v in metrics.items()}


def make_loss_fn(cfg: Config, graphdef, rest, packed_shape: tuple[int, int] | None = None) -> Callable:
    """loss(params, micro_batch, denominator, layout=None) -> (scalar loss, metrics); sums exactly over micro-batches.

    `packed_shape`: (rows, length): score each micro-batch as that many packed rows of prompt groups,
    `layout` = (row, first slot) of each of its groups (a `packing.RowPlan`'s, for one micro-batch);
    micro-batches then hold whole groups, each group's rows in order.
    """
    policy_loss = kernels.get_loss(cfg.loss)
    temperature = cfg.sampling.temperature
    max_len = cfg.aggregation_max_len or cfg.sampling.max_new_tokens

    def loss_fn(params, batch: TrainBatch, denominator, layout=None):
        policy = nnx.merge(graphdef, params, rest)
        completion_len = batch.completion_mask.shape[-1]
        mask = batch.completion_mask
        if packed_shape:
            rows, length = packed_shape
            packed = packing.pack_groups(batch.tokens, batch.attention_mask, completion_len, cfg.group_size, length,
                                         train_mask=mask, rows=rows, group_rows=layout[0], group_offsets=layout[1])
            logp, entropy, values = packing.packed_completion_outputs(
                policy.decoder, packed, temperature=temperature, value_head=policy.value_head if cfg.value_head else None)
        else:
            logp, entropy, values = completion_outputs(
                policy, batch.tokens, batch.attention_mask, batch.positions, completion_len, temperature,
                with_values=cfg.value_head,
            )
        per_token, metrics = policy_loss(logp, batch.old_logp, batch.advantages, mask, **cfg.loss_kwargs)
        metrics = dict(metrics)
        if cfg.kl_coef:
            # old_logp: k3_unbiased weights k3 by pi / pi_old, pi_old being the policy that sampled the batch.
            # mask: padding never reaches the arithmetic, so garbage there cannot make the gradient NaN.
            kl = kernels.kl_penalty(logp, batch.ref_logp, cfg.kl_kind, old_logp=batch.old_logp, mask=mask)
            per_token = per_token + cfg.kl_coef * kl * mask
            metrics["kl"] = masked_mean(kl, mask)
        if cfg.entropy_coef:
            per_token = per_token - cfg.entropy_coef * entropy * mask
        loss, parts = kernels.aggregate(per_token, mask, cfg.aggregation, max_len=max_len, denominator=denominator)
        metrics["policy_loss"] = loss
        if cfg.value_head:
            value_loss, value_metrics = kernels.clipped_value_loss(values, batch.old_values, batch.returns, mask)
            value_loss, _ = kernels.aggregate(value_loss, mask, cfg.aggregation, max_len=max_len, denominator=denominator)
            loss = loss + cfg.value_coef * value_loss
            metrics.update(value_metrics, value_loss=value_loss)
        metrics["entropy"] = masked_mean(entropy, mask)
        metrics["logp_gap"] = masked_mean(jnp.abs(logp - batch.old_logp), mask)
        return loss, metrics

    return loss_fn


def make_update_fn(cfg: Config, graphdef, rest, optimizer: optax.GradientTransformation, mesh, state_sharding,
                   packed_shape: tuple[int, int] | None = None):
    """The jitted update: (TrainState, TrainBatch [num_micro, micro, ...][, layout]) -> (TrainState, metrics).

    Gradients of the micro-batches are summed in a `lax.scan`; each micro-batch
    loss is divided by the whole minibatch's aggregation denominator, so the sum
    is exactly the minibatch loss and gradient. `packed_shape`: as in `make_loss_fn`, with `layout`
    the plan's (group rows, group offsets) [num_micro, groups per micro-batch] (no `layout` without packing).
    """
    loss_fn = make_loss_fn(cfg, graphdef, rest, packed_shape)
    max_len = cfg.aggregation_max_len or cfg.sampling.max_new_tokens
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def update(state: TrainState, batch: TrainBatch, layout=None):
        flat_mask = batch.completion_mask.reshape(-1, batch.completion_mask.shape[-1])
        denominator = kernels.aggregation_denominator(flat_mask, cfg.aggregation, max_len=max_len)

        def micro_step(carry, inputs):
            grads_acc, loss_acc = carry
            micro, micro_layout = inputs
            (loss, metrics), grads = grad_fn(state.params, micro, denominator, micro_layout)
            tokens = micro.completion_mask.sum()
            return (jax.tree.map(jnp.add, grads_acc, grads), loss_acc + loss), (_weighted_metrics(metrics, tokens), tokens)

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        (grads, loss), (metrics, tokens) = jax.lax.scan(micro_step, (zeros, jnp.zeros((), jnp.float32)), (batch, layout))
        total_tokens = jnp.maximum(tokens.sum(), 1.0)
        metrics = {k: v.sum() / total_tokens for k, v in metrics.items()}
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        metrics.update(loss=loss, grad_norm=optax.tree.norm(grads))
        return TrainState(params, opt_state, state.step + 1), metrics

    in_shardings = (state_sharding, NamedSharding(mesh, P(None, BATCH_AXES)))
    if packed_shape:
        in_shardings += (NamedSharding(mesh, P()),)  # the layout, replicated
    return jax.jit(
        update,
        in_shardings=in_shardings,
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
        donate_argnums=(0,),
    )


# -- host side: data, rollouts, rewards -------------------------------------------------


class Rollout(NamedTuple):
    """One step's sampled, scored batch of N = groups x group_size sequences (numpy, host side)."""

    prompt_tokens: np.ndarray  # i32[N, P] left padded
    prompt_mask: np.ndarray  # bool[N, P]
    completion_tokens: np.ndarray  # i32[N, C]
    completion_mask: np.ndarray  # f32[N, C]
    sampler_logp: np.ndarray  # f32[N, C]
    finished: np.ndarray  # bool[N] stopped on a stop token (not by length)
    rewards: np.ndarray  # f32[N]
    per_reward: dict  # name -> f32[N]
    correct: np.ndarray  # f32[N]
    valid: np.ndarray  # bool[N] the reward functions scored the row
    kept: np.ndarray  # bool[N] the row trains: its group carries signal under dynamic sampling (else all True)
    group_ids: np.ndarray  # i32[N]
    texts: list  # N completion strings
    examples: list  # N examples (one per row)

    @property
    def trains(self) -> np.ndarray:
        """bool[N]: scored rows of kept groups, the rows advantages and the loss see."""
        return self.valid & self.kept


class RowStats(NamedTuple):
    """The per-row numbers of a rollout that whole-batch computations need (advantages, metrics)."""

    rewards: np.ndarray  # f32[N]
    per_reward: dict  # name -> f32[N]
    correct: np.ndarray  # f32[N]
    valid: np.ndarray  # bool[N] scored rows
    kept: np.ndarray  # bool[N] rows that train (see `Rollout.kept`)
    group_ids: np.ndarray  # i32[N]
    finished: np.ndarray  # bool[N]
    lengths: np.ndarray  # f32[N] completion tokens
    prompt_lengths: np.ndarray  # i32[N] prompt tokens
    seq_logp: np.ndarray  # f32[N] mean sampler log-prob per completion token

    @property
    def trains(self) -> np.ndarray:
        """bool[N]: scored rows of kept groups (see `Rollout.trains`)."""
        return self.valid & self.kept


def row_stats(r: Rollout) -> RowStats:
    """The `RowStats` of a rollout's rows."""
    lengths = r.completion_mask.sum(-1)
    return RowStats(r.rewards, r.per_reward, r.correct, r.valid, r.kept, r.group_ids, r.finished, lengths,
                    r.prompt_mask.sum(-1).astype(np.int32), (r.sampler_logp * r.completion_mask).sum(-1) / np.maximum(lengths, 1))


def group_stats(correct: np.ndarray, group_ids: np.ndarray, valid: np.ndarray) -> dict[str, float]:
    """Fractions of groups that are all correct / all wrong, over groups with a valid row."""
    all_correct, all_wrong, groups = 0, 0, 0
    for g in np.unique(group_ids):
        rows = (group_ids == g) & valid
        if rows.any():
            groups += 1
            all_correct += bool(correct[rows].min() >= 1.0)
            all_wrong += bool(correct[rows].max() <= 0.0)
    groups = max(groups, 1)
    return {"frac_all_correct": all_correct / groups, "frac_all_wrong": all_wrong / groups}


class PromptStream:
    """Deterministic prompts by position in a shuffled, repeated grain dataset.

    The position (examples consumed so far) is all the state there is, so a
    resumed run continues exactly: grain's `MapDataset` is random access, with
    a fresh permutation each epoch derived from the seed.
    """

    def __init__(self, examples: Sequence[dict], seed: int):
        import grain

        if not len(examples):
            raise ValueError("the training split has no examples")
        self.examples = examples
        self._dataset = grain.MapDataset.source(examples).shuffle(seed=seed).repeat()
        self.position = 0

    def take(self, count: int, block: slice = slice(None)) -> list[dict]:
        """The next `count` examples, or only those at positions `block` of them (one process's share).

        The position advances by `count` either way, so every process stays at the same position.
        """
        batch = [self._dataset[self.position + i] for i in range(count)[block]]
        self.position += count
        return batch


def resolve_rewards(cfg: Config, task) -> list:
    """[(reward_fn, weight)] from `cfg.rewards` (names of `jaxgrpo.rewards` functions), or the task's defaults."""
    from jaxgrpo import rewards as reward_lib

    if not cfg.rewards:
        return list(task.default_rewards())
    pairs = []
    for name, weight in cfg.rewards.items():
        fn = getattr(reward_lib, name, None) or getattr(reward_lib, name + "_reward", None)
        if not callable(fn):
            valid = sorted(n for n in reward_lib.__all__ if callable(getattr(reward_lib, n)) and n.endswith(("_reward", "_penalty")))
            raise KeyError(f"unknown reward {name!r} in config.rewards; valid names: {', '.join(valid)}")
        pairs.append((fn, float(weight)))
    return pairs


def _toy_tiny(dtype, remat):
    from jaxgrpo import toy

    return toy.tiny_model(0, dtype=dtype, remat=remat)


#: Models built by code rather than loaded from a checkpoint: name -> fn(dtype, remat) -> (model, tokenizer).
MODEL_BUILDERS: dict[str, Callable[..., tuple]] = {"toy-tiny": _toy_tiny}


def register_model_builder(name: str, builder: Callable[..., tuple]) -> None:
    """Makes `Config.model = name` build its policy with `builder(dtype=..., remat=...)`."""
    MODEL_BUILDERS[name] = builder


def build_model(cfg: Config):
    """(model, tokenizer) for `cfg.model`: a registered builder, else `jaxgrpo.models.load`."""
    from jaxgrpo import models

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    dtype = getattr(jnp, cfg.dtype)
    if cfg.model in MODEL_BUILDERS:
        return MODEL_BUILDERS[cfg.model](dtype=dtype, remat=cfg.remat)
    return models.load(cfg.model, dtype=dtype, remat=cfg.remat)


def make_mesh(cfg: Config, devices: Sequence | None = None) -> jax.sharding.Mesh:
    """A (data, fsdp, model) mesh over `devices` (default: all devices), with Auto axes."""
    n = jax.device_count() if devices is None else len(devices)
    shape = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model]
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {shape}")
    fixed = math.prod(s for s in shape if s != -1)
    if n % fixed:
        raise ValueError(f"mesh (data, fsdp, model) = {tuple(shape)} does not divide the {n} devices; "
                         f"choose sizes whose product divides {n}")
    shape = [n // fixed if s == -1 else s for s in shape]
    if math.prod(shape) != n:
        raise ValueError(f"mesh (data, fsdp, model) = {tuple(shape)} uses {math.prod(shape)} devices but {n} are "
                         "present; set one axis to -1 to take the rest")
    return jax.make_mesh(tuple(shape), ("data", "fsdp", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3,
                         devices=devices)


# -- the loop ---------------------------------------------------------------------------


class Trainer:
    """Runs a `Config`: builds the policy, task, rewards, mesh and jitted update, then loops.

    Everything can also be passed in (a model and tokenizer, a task, reward
    functions) so tests and notebooks run without downloads.

    Multi-host (one process per host, `jax.distributed.initialize()` called
    first, as `jaxgrpo.cli` does): the mesh spans every host's devices and every
    process runs this same loop. The model is built identically everywhere (a
    fixed seed or the same weights file) and laid out on the global mesh.

    * Every host reads only its own share of the step's prompts: process p of
      P takes the contiguous block p of the `prompts_per_step` positions of the
      deterministic `PromptStream` (`sampler.process_block`; prompts_per_step
      must divide by P, so groups never straddle hosts), and all advance the
      stream to the same position.
    * Sampling is one global SPMD program: each host passes its prompts, the
      prompt bucket is agreed with a cross-process max and the padded prompts
      are gathered, so every host compiles and runs the same program; each
      host's rows of the result are on its own devices and it copies back only
      those (`sampler.local_rows`).
    * Each host decodes and scores its own rows. The small per-row numbers
      (rewards, validity, correctness, lengths: `RowStats`) are gathered, so
      every host computes the same advantages and metrics from the whole batch
      and keeps its rows' advantages.
    * The update's inputs are global arrays built from each host's rows; the
      minibatches are gathered from them on device, so a shuffle moves rows
      between hosts exactly as a single process would.
    * Dynamic sampling: each host keeps its own share of signal groups; a
      round's width is the largest number of groups any host still needs
      (a cross-process max), so all hosts run the same rounds and programs.
    * Checkpoints are written and restored by every process (orbax writes each
      host's shards); metrics, plots and progress bars come from process 0 only,
      and so do the run directory's lock and checks (`jaxgrpo.rundir`), whose
      verdict every process gets.

    The result equals a single-process run on the same number of devices
    (`tests/test_multihost.py`: 2 processes x 4 CPU devices vs 1 x 8).
    """

    def __init__(self, cfg: Config, *, model=None, tokenizer=None, task=None, reward_fns=None, mesh=None):
        from jaxgrpo import data

        validate(cfg, num_devices=None)  # every value, kernel name and kernel argument, before anything is built
        self.cfg = cfg
        self.mesh = mesh or make_mesh(cfg)
        if cfg.prompts_per_step % jax.process_count():
            raise ValueError(
                f"prompts_per_step={cfg.prompts_per_step} is not divisible by the {jax.process_count()} processes; "
                "each host reads an equal block of whole prompt groups"
            )

        if model is None:
            model, tokenizer = build_model(cfg)
        if tokenizer is None:
            raise ValueError(f"model {cfg.model!r} has no tokenizer; the trainer needs one to render prompts")
        self.tokenizer = tokenizer
        if task is None:
            import jaxgrpo.toy  # noqa: F401  (registers the offline toy_sum task)

            task = data.get_task(cfg.task.name, **cfg.task.kwargs)
        self.task = task
        self.reward_fns = reward_fns or resolve_rewards(cfg, self.task)
        self.stop_tokens = tuple(sampler.default_stop_tokens(tokenizer))
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

        self._attention_scale = packing.attention_scale(model.config)  # for packed row layouts
        shard_model(model, self.mesh)  # FSDP / tensor-parallel layout from the model's logical axes
        policy = Policy(model, value_head=cfg.value_head)
        self.graphdef, params, self.rest = nnx.split(policy, nnx.Param, ...)
        self.optimizer = make_optimizer(cfg.optimizer)
        with jax.set_mesh(self.mesh):
            opt_state = self.optimizer.init(params)
        # Every leaf on the mesh (scalars replicated), so the jitted update sees one input type.
        self.state = _on_mesh(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), self.mesh)
        self.state_sharding = jax.tree.map(lambda x: x.sharding, self.state)
        self.ref_params = jax.tree.map(jnp.copy, params) if cfg.kl_coef else None
        self._batch_sharding = NamedSharding(self.mesh, P(None, BATCH_AXES))

        self.train_examples = self.task.load(cfg.task.train_split, data_dir=cfg.task.data_dir)
        self.prompts = PromptStream(self.train_examples, cfg.seed)
        self.eval_examples = (
            self.task.load(cfg.task.eval_split, data_dir=cfg.task.data_dir, num_examples=cfg.task.num_eval_examples)
            if cfg.task.num_eval_examples
            else []
        )
        self._prompt_cache: dict[str, list[int]] = {}

    # -- pieces -----------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return nnx.merge(self.graphdef, self.state.params, self.rest)

    def prompt_ids(self, example: dict) -> list[int]:
        from jaxgrpo.data import render_prompt

        text = render_prompt(self.tokenizer, self.task.messages(example))
        if text not in self._prompt_cache:
            self._prompt_cache[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self._prompt_cache[text]

    def generate(self, examples: list[dict], num_samples: int, key: Array, *, greedy: bool = False, temperature=None,
                 prompt_ids: np.ndarray | None = None, process_local: bool = False):
        """`sampler.generate` on the examples' prompts; `process_local`: they are this host's block of the batch."""
        s = self.cfg.sampling
        return sampler.generate(
            self.policy.decoder,
            [self.prompt_ids(e) for e in examples],
            prompt_ids=prompt_ids,
            process_local=process_local,
            num_samples=num_samples,
            key=key,
            temperature=s.temperature if temperature is None else temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            min_p=s.min_p,
            greedy=greedy,
            max_new_tokens=s.max_new_tokens,
            stop_tokens=self.stop_tokens,
            pad_id=self.pad_id,
        )

    def score(self, texts: list[str], examples: list[dict], lengths: np.ndarray):
        """The rewards of N completions (texts, their examples, i32[N] token lengths), on this host."""
        from jaxgrpo import rewards as reward_lib

        result = reward_lib.score(self.reward_fns, texts, examples, completion_lengths=lengths)
        if self.cfg.correctness_reward not in result.per_reward:
            raise KeyError(
                f"correctness_reward={self.cfg.correctness_reward!r} is not among the rewards "
                f"{sorted(result.per_reward)}; set it to the reward that decides correctness"
            )
        return result

    def rollout(self, key: Array) -> tuple[Rollout, dict]:
        """Samples and scores this host's share of `prompts_per_step` groups (all of them in a single process).

        Returns this host's rows (group ids are global) and the step's timings.
        Under dynamic sampling, zero-signal groups are resampled: each round
        reads `need * processes` new prompts, `need` the most groups any host
        still lacks, so every host runs the same rounds with the same shapes.
        """
        cfg, g = self.cfg, self.cfg.group_size
        local_groups = cfg.prompts_per_step // jax.process_count()
        kept: list[Rollout] = []
        rejected: list[Rollout] = []
        rounds, timings, sampled_tokens = 0, {"time_sample": 0.0, "time_reward": 0.0}, 0
        while True:
            need = int(_across_processes(local_groups - sum(len(r.rewards) for r in kept) // g).max())
            if need <= 0 or rounds >= (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
                break
            block = sampler.process_block(need * jax.process_count())
            examples = self.prompts.take(need * jax.process_count(), block)
            t0 = time.perf_counter()
            out = self.generate(examples, g, jax.random.fold_in(key, rounds),
                                prompt_ids=np.arange(block.start, block.stop, dtype=np.int32), process_local=True)
            out = jax.tree.map(lambda x: sampler.local_rows(x, self.mesh), out)
            tokens = out.completion_tokens
            mask = out.completion_mask.astype(np.float32)
            timings["time_sample"] += time.perf_counter() - t0
            sampled_tokens += int(mask.sum())
            t0 = time.perf_counter()
            row_examples = [e for e in examples for _ in range(g)]
            lengths = mask.sum(-1).astype(np.int32)
            texts = self.tokenizer.batch_decode([t[: n] for t, n in zip(tokens, lengths)], skip_special_tokens=True)
            result = self.score(texts, row_examples, lengths)
            shaped = result.rewards
            if cfg.overlong_cache_len:
                shaped = shaped + np.asarray(kernels.overlong_penalty(
                    lengths, max_len=cfg.sampling.max_new_tokens, cache_len=cfg.overlong_cache_len)) * result.valid
            timings["time_reward"] += time.perf_counter() - t0
            correct = result.per_reward[self.cfg.correctness_reward].astype(np.float32)
            group_ids = np.repeat(np.arange(need), g).astype(np.int32)
            rollout = Rollout(
                # The untruncated policy log-probs: what the trainer computes for the same tokens.
                out.prompt_tokens, out.prompt_mask.astype(bool), tokens, mask,
                out.policy_logprobs.astype(np.float32), out.finish_reason == sampler.FINISH_STOP,
                shaped.astype(np.float32), result.per_reward, correct, result.valid, np.ones(len(correct), bool),
                group_ids, texts, row_examples,
            )
            if cfg.dynamic_sampling:
                keep = np.asarray(kernels.dynamic_sampling_filter(correct, group_ids, num_groups=need, valid=result.valid))
                keep_groups = np.unique(group_ids[keep])
                rollout = rollout._replace(kept=np.isin(group_ids, keep_groups))
                kept.append(_select_groups(rollout, keep_groups))
                rejected.append(_select_groups(rollout, np.setdiff1d(np.arange(need), keep_groups)))
            else:
                kept.append(rollout)
            rounds += 1
        # Rejected groups fill the batch after the kept ones (static shapes) without training: they
        # still count in the step's reward metrics, which describe what the policy sampled.
        batch = _concat_rollouts(kept + rejected, local_groups, g)
        batch = batch._replace(group_ids=batch.group_ids + sampler.process_block(cfg.prompts_per_step).start)
        timings.update(sampling_rounds=rounds, sampled_tokens=int(_across_processes(sampled_tokens).sum()))
        return batch, timings

    def advantages(self, batch: Rollout, stats: RowStats | None = None) -> np.ndarray:
        """The registered estimator's advantages f32[n] of this host's n rows, from the whole batch's `RowStats`.

        `stats`: the whole batch's `_gather_rows(row_stats(batch))`, if the caller
        already has it (`train_step` gathers it once per step); gathered here otherwise.

        Estimators that take more than rewards get what they ask for by keyword,
        when the trainer has it: `reward_weights` (then rewards are [N, K], one
        column per reward function), `lengths` (completion tokens), `seq_logp`
        (mean sampler log-prob per completion).
        """
        cfg = self.cfg
        if stats is None:
            stats = _gather_rows(row_stats(batch))
        estimator = kernels.get_advantage(cfg.advantage)
        accepted = inspect.signature(estimator).parameters
        available = {
            "reward_weights": np.array([w for _, w in self.reward_fns], np.float32),
            "lengths": stats.lengths.astype(np.float32),
            "seq_logp": stats.seq_logp,
        }
        # `validate` keeps these names (config.TRAINER_ADVANTAGE_KWARGS) out of advantage_kwargs.
        kwargs = {k: v for k, v in available.items() if k in accepted}
        kwargs.update(cfg.advantage_kwargs)
        rewards = stats.rewards
        if "reward_weights" in accepted:
            rewards = np.stack(list(stats.per_reward.values()), axis=-1)
        advantages = estimator(jnp.asarray(rewards), jnp.asarray(stats.group_ids), num_groups=cfg.prompts_per_step,
                               valid=jnp.asarray(stats.trains), **kwargs)
        return np.asarray(advantages)[sampler.process_block(len(stats.rewards))]

    def train_batch(self, batch: Rollout, stats: RowStats | None = None) -> TrainBatch:
        """Assembles the arrays the jitted update consumes (advantages, reference log-probs, GAE).

        `stats`: the whole batch's `_gather_rows(row_stats(batch))`, if the caller
        already has it (`train_step` gathers it once per step); gathered here when needed otherwise.
        """
        cfg = self.cfg
        if stats is None and (cfg.loss_mask or not cfg.value_head):
            stats = _gather_rows(row_stats(batch))
        tokens = np.concatenate([batch.prompt_tokens, batch.completion_tokens], axis=1).astype(np.int32)
        attention = np.concatenate([batch.prompt_mask, batch.completion_mask > 0], axis=1)
        positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
        valid = batch.trains
        if cfg.loss_mask:
            keep = kernels.get("mask", cfg.loss_mask)(
                jnp.asarray(stats.rewards), jnp.asarray(stats.group_ids), num_groups=cfg.prompts_per_step,
                valid=jnp.asarray(stats.trains))
            valid = valid & np.asarray(keep)[sampler.process_block(len(stats.rewards))]
        mask = batch.completion_mask * valid[:, None]
        old_logp = batch.sampler_logp
        zeros = np.zeros_like(mask)
        ref_logp, returns, old_values = zeros, zeros, zeros
        if cfg.kl_coef or cfg.value_head:
            ref_logp, old_values = self._reference_outputs(tokens, attention, positions, mask.shape[1])
        if cfg.value_head:
            token_rewards = np.zeros_like(mask)
            last = np.maximum(mask.sum(-1).astype(np.int32) - 1, 0)
            token_rewards[np.arange(len(last)), last] = batch.rewards * valid
            if cfg.kl_coef:
                token_rewards = token_rewards - cfg.kl_coef * (old_logp - ref_logp) * mask
            adv, returns = kernels.gae(jnp.asarray(token_rewards), jnp.asarray(old_values), jnp.asarray(mask),
                                       gamma=cfg.gae_gamma, lam=cfg.gae_lambda)
            # Whitened over the whole batch's tokens: the per-token advantages of every host.
            whole = _gather_rows({"adv": np.asarray(adv), "mask": mask})
            advantages = np.asarray(kernels.masked_whiten(jnp.asarray(whole["adv"]), jnp.asarray(whole["mask"])))
            advantages = advantages[sampler.process_block(len(advantages))]
            returns = np.asarray(returns)
        else:
            advantages = np.broadcast_to(self.advantages(batch, stats)[:, None], mask.shape)
        return TrainBatch(tokens, attention, positions, mask.astype(np.float32), old_logp.astype(np.float32),
                          np.asarray(advantages, np.float32), np.asarray(ref_logp, np.float32),
                          np.asarray(returns, np.float32), np.asarray(old_values, np.float32))

    def _reference_outputs(self, tokens, attention, positions, completion_len):
        """(reference-policy log-probs, current values) f32[n, C] of this host's n rows, without gradients."""
        fn = self._forward_fn()
        inputs = _global_batch((tokens, attention, positions), self.mesh)
        ref_logp = values = np.zeros((tokens.shape[0], completion_len), np.float32)
        if self.ref_params is not None:
            ref_logp = sampler.local_rows(fn(self.ref_params, *inputs, completion_len)[0], self.mesh)
        if self.cfg.value_head:
            values = sampler.local_rows(fn(self.state.params, *inputs, completion_len)[1], self.mesh)
        return ref_logp, values

    @functools.cache
    def _forward_fn(self):
        cfg = self.cfg

        @functools.partial(jax.jit, static_argnums=(4,))
        def forward(params, tokens, attention, positions, completion_len):
            policy = nnx.merge(self.graphdef, params, self.rest)
            logp, _, values = completion_outputs(policy, tokens, attention, positions, completion_len,
                                                 cfg.sampling.temperature, with_values=cfg.value_head)
            return logp, (values if values is not None else jnp.zeros_like(logp))

        return forward

    def update(self, batch: TrainBatch) -> dict:
        """num_epochs x num_minibatches jitted updates over the batch (this host's rows); returns the mean metrics.

        Minibatches are shuffled over the whole batch by whole groups (packing scores a group at once):
        they are gathered on device from the global batch, so rows move between hosts as needed.
        """
        cfg = self.cfg
        whole = _global_batch(batch, self.mesh)
        n = whole.tokens.shape[0]
        minibatch = n // cfg.num_minibatches
        micro = cfg.micro_batch_size or minibatch
        rng = np.random.default_rng([cfg.seed, int(self.state.step), 7])
        lengths = self.group_lengths(batch)
        history = []
        for epoch in range(cfg.num_epochs):
            order = np.arange(n)
            if epoch or cfg.num_minibatches > 1:  # whole groups, each group's rows in order
                g = cfg.group_size
                order = (rng.permutation(n // g)[:, None] * g + np.arange(g)).ravel()
            for m in range(cfg.num_minibatches):
                rows = order[m * minibatch : (m + 1) * minibatch]
                update, layout = self._update_fn(None), ()
                if lengths is not None:
                    rows, plan = packing.plan_rows(rows, lengths, cfg.group_size, micro,
                                                   attention_scale=self._attention_scale)
                    update = self._update_fn((plan.rows, plan.length))
                    layout = ((plan.group_rows, plan.group_offsets),)
                mb = self._take_rows(whole, rows.reshape(minibatch // micro, micro))
                with jax.set_mesh(self.mesh):
                    self.state, metrics = update(self.state, mb, *layout)
                history.append(metrics)
        metrics = {k: float(np.mean([float(h[k]) for h in history])) for k in history[0]}
        metrics["logp_gap"] = float(history[0]["logp_gap"])  # before any update: sampler vs trainer
        return metrics

    def group_lengths(self, batch: TrainBatch) -> np.ndarray | None:
        """Packed slots of every group of the whole batch (`packing.group_lengths`; None without `cfg.packing`)."""
        if not self.cfg.packing:
            return None
        local = packing.group_lengths(np.asarray(batch.attention_mask), np.asarray(batch.completion_mask),
                                      batch.completion_mask.shape[-1], self.cfg.group_size)
        return _gather_rows(local.astype(np.int32))

    @functools.cache
    def _update_fn(self, packed_shape: tuple[int, int] | None):
        """The jitted update for one packed shape (rows, length) per micro-batch (compiled on first use; logged).

        Lengths are multiples of `packing.PACK_MULTIPLE`, so a run compiles a few of them."""
        if packed_shape is not None:
            logger.info("compiling the update for micro-batches of %d packed rows x %d slots", *packed_shape)
        return make_update_fn(self.cfg, self.graphdef, self.rest, self.optimizer, self.mesh, self.state_sharding,
                              packed_shape)

    @functools.cache
    def _take_rows_fn(self):
        """jit(batch [N, ...], rows i32[M, m]) -> batch [M, m, ...] laid out for the update."""
        return jax.jit(lambda batch, rows: jax.tree.map(lambda x: x[rows], batch), out_shardings=self._batch_sharding)

    def _take_rows(self, batch: TrainBatch, rows: np.ndarray) -> TrainBatch:
        with jax.set_mesh(self.mesh):
            return self._take_rows_fn()(batch, rows)

    def correct_flags(self, texts: list[str], examples: list[dict]) -> np.ndarray:
        """Correctness (the `correctness_reward`) f32[N] of N completions; every host holds all N of them.

        In a multi-host run each host scores its `sampler.process_block` of the
        rows and the flags are gathered (`_gather_rows`). The evaluation's sizes
        are user-chosen (`num_eval_examples`, times `eval_pass_k`), so when N does
        not divide by the process count no error is raised: every host scores all
        N rows itself. Every host already holds all N texts (`evaluate` samples the
        whole evaluation set everywhere), host-side scoring is cheap next to that
        sampling, and the result is the same either way (rewards are per row).
        """
        n, count = len(texts), jax.process_count()
        shared = count > 1 and n >= count and n % count == 0
        rows = sampler.process_block(n) if shared else slice(None)
        texts, examples = texts[rows], examples[rows]
        lengths = np.array([len(self.tokenizer.encode(t)) for t in texts], np.int32)
        correct = self.score(texts, examples, lengths).per_reward[self.cfg.correctness_reward].astype(np.float32)
        return _gather_rows(correct) if shared else correct

    def evaluate(self, step: int) -> dict:
        """Greedy accuracy, and pass@1 / pass@k of `eval_pass_k` samples, on the held-out examples."""
        if not self.eval_examples:
            return {}
        examples = list(self.eval_examples)
        key = jax.random.fold_in(jax.random.key(self.cfg.seed + 1), step)
        greedy_texts = _decode(self.tokenizer, self.generate(examples, 1, key, greedy=True))
        metrics = {"greedy_accuracy": float(self.correct_flags(greedy_texts, examples).mean())}
        k = self.cfg.eval_pass_k
        if k > 1:
            texts = _decode(self.tokenizer, self.generate(examples, k, key))
            correct = self.correct_flags(texts, [e for e in examples for _ in range(k)]).reshape(len(examples), k)
            num_correct = correct.sum(-1)
            metrics["pass@1"] = float(np.mean([pass_at_k(k, int(c), 1) for c in num_correct]))
            metrics[f"pass@{k}"] = float(np.mean([pass_at_k(k, int(c), k) for c in num_correct]))
        return metrics

    # -- supervised warm-up -----------------------------------------------------------

    def reference_completion(self, example: dict) -> list[int]:
        """Token ids of a correct completion: the task's own, else "The answer is N.", then EOS."""
        text = getattr(self.task, "reference_completion", None)
        text = text(example) if text else f"The answer is {example['answer']}."
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return ids + [eos] if eos is not None else ids

    def warmup(self, steps: int, *, lr: float | None = None, batch_size: int | None = None) -> list[float]:
        """Supervised warm-up on reference completions (teacher forcing); returns the losses.

        A tiny random model cannot sample a correct answer at all; a few SFT
        steps give it the partial competence that makes group-relative RL work.
        The RL optimizer state is left untouched.
        """
        cfg = self.cfg
        batch_size = batch_size or cfg.batch_size
        optimizer = optax.adam(lr or cfg.warmup_sft_lr, eps=cfg.optimizer.eps)
        params = self.state.params
        opt_state = optimizer.init(params)

        @jax.jit
        def sft_step(params, opt_state, tokens, attention, positions, mask):
            def nll(p):
                policy = nnx.merge(self.graphdef, p, self.rest)
                logp, _, _ = completion_outputs(policy, tokens, attention, positions, mask.shape[1], 1.0, with_values=False)
                return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)

            loss, grads = jax.value_and_grad(nll)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        stream = PromptStream(self.train_examples, cfg.seed + 12345)
        losses = []
        for _ in range(steps):
            examples = stream.take(batch_size)
            prompts = [self.prompt_ids(e) for e in examples]
            answers = [self.reference_completion(e) for e in examples]
            width = max(map(len, prompts))
            cwidth = max(map(len, answers))
            tokens = np.full((batch_size, width + cwidth), self.pad_id, np.int32)
            attention = np.zeros(tokens.shape, bool)
            mask = np.zeros((batch_size, cwidth), np.float32)
            for i, (p, a) in enumerate(zip(prompts, answers)):
                tokens[i, width - len(p) : width] = p
                tokens[i, width : width + len(a)] = a
                attention[i, width - len(p) : width + len(a)] = True
                mask[i, : len(a)] = 1.0
            positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
            with jax.set_mesh(self.mesh):
                params, opt_state, loss = sft_step(params, opt_state, tokens, attention, positions, mask)
            losses.append(float(loss))
        self.state = self.state._replace(params=params)
        if self.ref_params is not None:  # the KL anchor is the warmed-up policy
            self.ref_params = jax.tree.map(jnp.copy, params)
        return losses

    # -- checkpoints ------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        return {"train": self.state, **({"ref": self.ref_params} if self.ref_params is not None else {})}

    def save(self, checkpointer, step: int, key: Array) -> None:
        """Saves the train state (and reference policy); the step, data position and RNG key go in the metadata."""
        meta = {"step": step, "data_position": self.prompts.position,
                "rng_key_data": np.asarray(jax.random.key_data(key)).tolist()}
        checkpointer.save(step, self.checkpoint_state(), meta)

    def restore(self, checkpointer) -> tuple[int, Array] | None:
        """Restores the newest checkpoint that restores; returns (step, RNG key), or None without checkpoints.

        Damaged newer checkpoints are skipped with one warning naming them (`Checkpointer.restore_newest`).
        """
        found = checkpointer.restore_newest(self.checkpoint_state())
        if found is None:
            return None
        step, restored, meta, skipped = found
        if skipped and jax.process_index() == 0:
            logger.warning("checkpoint(s) in %s did not restore and were moved to %s; resumed from step %d: %s",
                           checkpointer.directory, checkpointer.damaged_directory, step,
                           "; ".join(f"step {s}: {r}" for s, r in skipped))
        self.state = restored["train"]
        if self.ref_params is not None:
            self.ref_params = restored["ref"]
        self.prompts.position = int(meta["data_position"])
        return int(meta["step"]), jax.random.wrap_key_data(np.asarray(meta["rng_key_data"], np.uint32))

    # -- the loop ---------------------------------------------------------------------

    def train_step(self, step: int, key: Array) -> dict:
        """One GRPO step: rollout, advantages, updates. Returns the step's metrics."""
        t_start = time.perf_counter()
        rollout, metrics = self.rollout(jax.random.fold_in(key, step))
        stats = _gather_rows(row_stats(rollout))  # the whole batch's, on every host: gathered once per step
        batch = self.train_batch(rollout, stats)
        t0 = time.perf_counter()
        metrics.update(self.update(batch))
        metrics["time_train"] = time.perf_counter() - t0
        valid = stats.valid
        trained_tokens = float(stats.prompt_lengths.sum() + stats.lengths.sum()) * self.cfg.num_epochs
        metrics.update(
            reward_mean=float(stats.rewards[valid].mean()) if valid.any() else float("nan"),
            reward_std=float(stats.rewards[valid].std()) if valid.any() else float("nan"),
            accuracy=float(stats.correct[valid].mean()) if valid.any() else float("nan"),
            completion_length=float(stats.lengths.mean()),
            frac_truncated=float(1.0 - stats.finished.mean()),
            num_invalid_rewards=float((~valid).sum()),
            frac_trained_rows=float(stats.trains.mean()),
            sample_tokens_per_s=metrics["sampled_tokens"] / max(metrics["time_sample"], 1e-9),
            train_tokens_per_s=trained_tokens / max(metrics["time_train"], 1e-9),
            time_step=time.perf_counter() - t_start,
            **{f"reward/{k}": float(v[valid].mean()) if valid.any() else float("nan") for k, v in stats.per_reward.items()},
            **group_stats(stats.correct, stats.group_ids, valid),
        )
        return metrics

    def run(self, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
            on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
        """Trains for `cfg.steps` steps into `cfg.run_dir`; returns the records of the steps it ran.

        A run directory that already holds a run is refused unless `resume` (continue from its newest
        checkpoint that restores, with a config that differs only in `rundir.RESUMABLE_KEYS`) or
        `overwrite` (delete it and start over); a directory another run holds is refused
        (`jaxgrpo.rundir.RunDirectoryError`). The run stops with `NoLearningSignal` after
        `cfg.max_steps_without_signal` consecutive steps in which no row trains.

        `on_step(step, record)` is called after each step's metrics, evaluation
        and checkpoint are written (e.g. for live plots in a notebook).
        """
        from jaxgrpo.config import to_dict
        from jaxgrpo.rundir import RunDirectory

        cfg = self.cfg
        config = to_dict(cfg)
        with RunDirectory.open(cfg.run_dir, config, resume=resume, overwrite=overwrite,
                               defaults=to_dict(Config())) as run_directory:
            return self._run(run_directory, config, resume=resume, progress=progress, on_step=on_step)

    def _run(self, run_directory, config: dict, *, resume: bool, progress: bool, on_step) -> list[dict]:
        from jaxgrpo.checkpoint import Checkpointer
        from jaxgrpo.metrics import EVAL_FILE, MetricsWriter

        cfg = self.cfg
        writer = MetricsWriter(cfg.run_dir)
        checkpointer = Checkpointer(os.path.join(cfg.run_dir, "checkpoints"), keep=cfg.keep_checkpoints)
        try:
            key = jax.random.key(cfg.seed)
            start = 0
            restored = self.restore(checkpointer) if resume else None
            if restored is not None:
                start, key = restored
            elif resume and writer.enabled:
                print(f"--resume: no checkpoint in {checkpointer.directory}; starting from step 0")
            if resume:  # records after the checkpoint (all of them from step 0) are written again
                writer.truncate_after(start if restored is not None else -1)
            run_directory.write_config(config)  # the run can start: this is now the config of its checkpoints
            if start == 0 and cfg.warmup_sft_steps:
                losses = self.warmup(cfg.warmup_sft_steps)
                if writer.enabled:  # process 0 speaks for a multi-host run
                    print(f"supervised warm-up: {cfg.warmup_sft_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
            if start == 0 and self.eval_examples and cfg.eval_every:
                writer.write(0, self.evaluate(0), file=EVAL_FILE, prefix="eval/")
            history = []
            without_signal = 0  # consecutive steps in which no row trained
            bar = _progress(range(start, cfg.steps), enabled=progress and writer.enabled, initial=start, total=cfg.steps)
            for step in bar:
                metrics = self.train_step(step, key)
                record = writer.write(step + 1, metrics)
                history.append(record)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc=f"{record['accuracy']:.2f}",
                                    s_per_step=f"{record['time_step']:.1f}")
                done = step + 1
                without_signal = without_signal + 1 if record["frac_trained_rows"] == 0 else 0
                if without_signal:
                    self._no_signal(done, without_signal, warn=writer.enabled)
                if cfg.eval_every and self.eval_examples and (done % cfg.eval_every == 0 or done == cfg.steps):
                    writer.write(done, self.evaluate(done), file=EVAL_FILE, prefix="eval/")
                if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                    self.save(checkpointer, done, key)
                if on_step is not None:
                    on_step(done, record)
            return history
        finally:
            checkpointer.close()
            writer.close()

    def _no_signal(self, step: int, count: int, *, warn: bool) -> None:
        """Warns of a step in which no row trained; raises `NoLearningSignal` at `max_steps_without_signal` in a row."""
        limit = self.cfg.max_steps_without_signal
        if limit and count >= limit:
            raise NoLearningSignal(
                f"steps {step - count + 1}-{step} trained no row ({count} in a row, max_steps_without_signal={limit}): "
                "every reward was invalid (NaN: check the reward functions and that the task's examples have "
                "answers) or dynamic sampling found no group with differing rewards; fix that, or set "
                "max_steps_without_signal=0 to train on regardless"
            )
        if warn:
            logger.warning("step %d trained no row (frac_trained_rows=0: every reward invalid or every group "
                           "filtered out); %d such step(s) in a row%s", step, count,
                           f", the run stops at {limit}" if limit else "")


class NoLearningSignal(RuntimeError):
    """Consecutive steps trained no row (`Config.max_steps_without_signal`); the message says what to check."""


# -- small helpers ----------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _on_mesh(tree, mesh):
    """Leaves not already laid out on `mesh` are replicated over it."""

    def place(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(x, NamedSharding(mesh, P()))

    return jax.tree.map(place, tree)


def _to_host(tree):
    """Numpy copies of a pytree's arrays, the same global values on every process.

    Arrays that span other processes' devices (the sampler's rows are split over
    every host) are gathered with `process_allgather`; the rest are copied.
    """

    def fetch(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(fetch, tree)


def _global_batch(tree, mesh):
    """The global batch from every host's rows (numpy [n, ...], block `process_index` of it).

    A single process already holds the whole batch: its numpy arrays are returned as they are.
    """
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(lambda x: sampler.global_rows(x, mesh), tree)


def _gather_rows(tree):
    """The whole batch of per-row numpy arrays [N, ...] from every host's block [n, ...], in process order.

    For small per-row arrays (rewards, flags, lengths); a single process's are returned as they are.
    """
    if jax.process_count() == 1:
        return tree
    wire = lambda x: x.astype(np.int32) if x.dtype == bool else x  # noqa: E731  (gathered as int32)
    gathered = multihost_utils.process_allgather(jax.tree.map(wire, tree), tiled=True)
    return jax.tree.map(lambda x, g: np.asarray(g).astype(x.dtype), tree, gathered)


def _across_processes(value) -> np.ndarray:
    """A scalar from every process: [process_count] in process order."""
    if jax.process_count() == 1:
        return np.array([value])
    return np.asarray(multihost_utils.process_allgather(np.asarray(value)))


def _decode(tokenizer, out) -> list[str]:
    tokens, mask = _to_host((out.completion_tokens, out.completion_mask))
    lengths = mask.sum(-1).astype(int)
    return tokenizer.batch_decode([t[:n] for t, n in zip(tokens, lengths)], skip_special_tokens=True)


def _select_groups(r: Rollout, groups: np.ndarray) -> Rollout:
    rows = np.flatnonzero(np.isin(r.group_ids, groups))
    return Rollout(
        *(x[rows] for x in r[:6]), r.rewards[rows], {k: v[rows] for k, v in r.per_reward.items()},
        r.correct[rows], r.valid[rows], r.kept[rows], r.group_ids[rows],
        [r.texts[i] for i in rows], [r.examples[i] for i in rows],
    )


def _concat_rollouts(parts: list[Rollout], num_groups: int, group_size: int) -> Rollout:
    """Concatenates rollouts (padding prompts to one length) and keeps the first `num_groups` groups."""
    parts = [p for p in parts if len(p.rewards)]
    width = max(p.prompt_tokens.shape[1] for p in parts)
    cwidth = max(p.completion_tokens.shape[1] for p in parts)

    def left_pad(x, w):
        return np.pad(x, ((0, 0), (w - x.shape[1], 0)))

    def right_pad(x, w):
        return np.pad(x, ((0, 0), (0, w - x.shape[1])))

    n = num_groups * group_size
    cat = lambda xs: np.concatenate(xs)[:n]
    group_ids = np.repeat(np.arange(sum(len(p.rewards) for p in parts) // group_size), group_size)[:n]
    return Rollout(
        cat([left_pad(p.prompt_tokens, width) for p in parts]),
        cat([left_pad(p.prompt_mask, width) for p in parts]),
        cat([right_pad(p.completion_tokens, cwidth) for p in parts]),
        cat([right_pad(p.completion_mask, cwidth) for p in parts]),
        cat([right_pad(p.sampler_logp, cwidth) for p in parts]),
        cat([p.finished for p in parts]),
        cat([p.rewards for p in parts]),
        {k: cat([p.per_reward[k] for p in parts]) for k in parts[0].per_reward},
        cat([p.correct for p in parts]),
        cat([p.valid for p in parts]),
        cat([p.kept for p in parts]),
        group_ids.astype(np.int32),
        sum((p.texts for p in parts), [])[:n],
        sum((p.examples for p in parts), [])[:n],
    )


def _progress(iterable, *, enabled: bool, initial: int, total: int):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, initial=initial, total=total, desc="train", dynamic_ncols=True)
