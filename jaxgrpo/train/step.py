"""The pure update: (TrainState, TrainBatch) -> (TrainState, metrics), jitted with the state donated.

The loss is a sum of terms over the completion tokens, each from a registered kernel or a
coefficient of the `Objective`: the policy loss (`cfg.loss`), a KL penalty to the reference policy
(the registered estimator `cfg.kl_kind` with `cfg.kl_kwargs`, weighted by `cfg.kl_coef`),
an entropy bonus, a clipped value loss (PPO), and a likelihood term (supervised warm-up, where it is
the only term). The terms are aggregated with the registered aggregation mode, whose whole-minibatch
denominator is computed before the micro-batch scan, so gradients accumulated over micro-batches
equal the whole minibatch's exactly.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo import kernels
from jaxgrpo.config import Config
from jaxgrpo.distributed import BATCH_AXES
from jaxgrpo.kernels.segments import masked_mean
from jaxgrpo.models import packing
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.logprobs import token_logprobs_and_entropy
from jaxgrpo.train import inputs as inputs_lib
from jaxgrpo.train.state import Policy, TrainState

Array = jax.Array


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
    #: Per-row fields [...] the policy loss reads by name (`inputs.LOSS_ROW_FIELDS`: rewards, group_ids, valid).
    rows: dict = {}


class Objective(NamedTuple):
    """The terms of the loss and how they are aggregated; a coefficient of 0 (or no loss name) drops a term."""

    loss: str | None  # registered policy loss, or None for no policy term
    loss_kwargs: dict
    kl_coef: float
    kl_kind: str  # a registered "kl" estimator
    kl_kwargs: dict
    entropy_coef: float
    value_coef: float  # 0 without a value head
    likelihood_coef: float  # weight of -log p(token): teacher forcing on the batch's completions
    aggregation: str
    max_len: int  # L_max of seq_mean_token_sum_norm
    temperature: float  # of the log-probs (the sampler's)


def objective_of(cfg: Config) -> Objective:
    """The RL objective a config names."""
    return Objective(cfg.loss, dict(cfg.loss_kwargs), cfg.kl_coef, cfg.kl_kind, dict(cfg.kl_kwargs), cfg.entropy_coef,
                     cfg.value_coef if cfg.value_head else 0.0, 0.0, cfg.aggregation,
                     cfg.aggregation_max_len or cfg.sampling.max_new_tokens, cfg.sampling.temperature)


def likelihood_objective(cfg: Config) -> Objective:
    """Supervised fine-tuning: the mean negative log-likelihood of the completion tokens at temperature 1."""
    return Objective(None, {}, 0.0, cfg.kl_kind, {}, 0.0, 0.0, 1.0, "token_mean",
                     cfg.aggregation_max_len or cfg.sampling.max_new_tokens, 1.0)


def completion_outputs(policy: Policy, tokens, attention_mask, positions, completion_len: int, temperature: float, *, with_values: bool):
    """Per-token log-probs, entropies (and values) of the last `completion_len` tokens.

    The hidden state at position t predicts token t + 1, so the completion's
    tokens are scored from the hidden states just before them. Log-probs are
    computed in vocabulary chunks (never materializing [B, C, V] float32 logits).
    """
    decoder = policy.decoder
    hidden = decoder.forward(tokens, positions, AttentionLayout.padded(attention_mask))
    prompt_len = tokens.shape[1] - completion_len
    hidden = hidden[:, prompt_len - 1 : -1]
    logp, entropy = token_logprobs_and_entropy(
        hidden, decoder.unembedding(), tokens[:, prompt_len:], temperature=temperature,
        logit_softcap=decoder.config.final_logit_softcapping,
    )
    values = policy.value_head(hidden) if with_values else None
    return logp, entropy, values


def make_loss_fn(cfg: Config, graphdef, rest, packed_shape: tuple[int, int, int] | None = None,
                 objective: Objective | None = None) -> Callable:
    """loss(params, micro_batch, denominator, layout=None) -> (scalar loss, metrics); sums exactly over micro-batches.

    `objective`: the terms (default: `objective_of(cfg)`). `packed_shape`: (rows, length, tree size): score each
    micro-batch as that many packed rows of trees of `tree size` rows sharing a prompt (a prompt group, or one
    row: `batch.packed_trees`), `layout` = (row, first slot) of each of its trees (a `packing.RowPlan`'s, for one
    micro-batch); micro-batches then hold whole trees, each tree's rows in order.
    """
    o = objective or objective_of(cfg)
    policy_loss = kernels.get_loss(o.loss) if o.loss else None
    kl_estimator = kernels.get("kl", o.kl_kind) if o.kl_coef else None
    with_values = bool(o.value_coef)
    required, optional = inputs_lib.fields_read(policy_loss, o.loss_kwargs) if policy_loss else ([], [])
    extra_fields = [n for n in required + optional if n not in ("logp", "old_logp", "advantages", "mask")]

    def loss_fn(params, batch: TrainBatch, denominator, layout=None):
        policy = nnx.merge(graphdef, params, rest)
        completion_len = batch.completion_mask.shape[-1]
        mask = batch.completion_mask
        if packed_shape:
            rows, length, tree = packed_shape
            packed = packing.pack_groups(batch.tokens, batch.attention_mask, completion_len, tree, length,
                                         train_mask=mask, rows=rows, group_rows=layout[0], group_offsets=layout[1])
            logp, entropy, values = packing.packed_completion_outputs(
                policy.decoder, packed, temperature=o.temperature, value_head=policy.value_head if with_values else None)
        else:
            logp, entropy, values = completion_outputs(
                policy, batch.tokens, batch.attention_mask, batch.positions, completion_len, o.temperature,
                with_values=with_values,
            )
        metrics = {}
        per_token = jnp.zeros_like(logp)
        if policy_loss is not None:
            available = {"entropy": entropy, "num_groups": cfg.prompts_per_step, **batch.rows}
            extra = {n: available[n] for n in extra_fields if n in available}
            per_token, policy_metrics = policy_loss(logp, batch.old_logp, batch.advantages, mask, **extra,
                                                    **o.loss_kwargs)
            metrics.update(policy_metrics)
        if o.likelihood_coef:
            per_token = per_token - o.likelihood_coef * logp * mask
        if o.kl_coef:
            # old_logp: k3_unbiased weights k3 by pi / pi_old, pi_old being the policy that sampled the batch.
            # mask: padding never reaches the arithmetic, so garbage there cannot make the gradient NaN.
            kl = kl_estimator(logp, batch.ref_logp, old_logp=batch.old_logp, mask=mask, **o.kl_kwargs)
            per_token = per_token + o.kl_coef * kl * mask
            metrics["kl"] = masked_mean(kl, mask)
        if o.entropy_coef:
            per_token = per_token - o.entropy_coef * entropy * mask
        loss, _ = kernels.aggregate(per_token, mask, o.aggregation, max_len=o.max_len, denominator=denominator)
        metrics["policy_loss"] = loss
        if with_values:
            value_loss, value_metrics = kernels.clipped_value_loss(values, batch.old_values, batch.returns, mask)
            value_loss, _ = kernels.aggregate(value_loss, mask, o.aggregation, max_len=o.max_len, denominator=denominator)
            loss = loss + o.value_coef * value_loss
            metrics.update(value_metrics, value_loss=value_loss)
        metrics["entropy"] = masked_mean(entropy, mask)
        metrics["logp_gap"] = masked_mean(jnp.abs(logp - batch.old_logp), mask)
        return loss, metrics

    return loss_fn


#: The loss function's metrics that are a micro-batch's share of a minibatch total (its loss terms aggregated over
#: the whole minibatch's denominator): the minibatch's value is their sum over micro-batches. The others are means
#: over a micro-batch's tokens, combined weighted by its tokens.
SUMMED_METRICS = ("policy_loss", "value_loss")


def all_finite(tree) -> Array:
    """bool[]: every floating-point element of `tree` is finite (integer leaves always are)."""
    flags = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack(flags).all() if flags else jnp.array(True)


class BoundProgram(NamedTuple):
    """A jitted program of (frozen, *args) with `frozen` bound: called, traced and lowered with *args.

    `frozen` is the policy's state that does not train (`nnx.split`'s rest: a LoRA run's base weights, nothing
    much otherwise). It is an argument of the compiled program, laid out where it lives, never a constant
    folded into it, so a program over a frozen 8B model takes its weights as inputs (as the compile report counts them).
    """

    program: Callable
    frozen: object

    def __call__(self, *args):
        return self.program(self.frozen, *args)

    def trace(self, *args):
        return self.program.trace(self.frozen, *args)

    def lower(self, *args):
        return self.program.lower(self.frozen, *args)


def shardings_of(tree):
    """The shardings of a tree of placed arrays (or of `jax.ShapeDtypeStruct`s carrying one)."""
    return jax.tree.map(lambda x: x.sharding, tree)


def make_update_fn(cfg: Config, graphdef, rest, optimizer: optax.GradientTransformation, mesh, state_sharding,
                   packed_shape: tuple[int, int, int] | None = None, objective: Objective | None = None) -> BoundProgram:
    """The jitted update: (TrainState, TrainBatch [num_micro, micro, ...][, layout]) -> (TrainState, metrics).

    Gradients of the micro-batches are summed in a `lax.scan`; each micro-batch
    loss is divided by the whole minibatch's aggregation denominator, so the sum
    is exactly the minibatch loss and gradient. An update whose loss, gradient norm,
    new parameters or new optimizer state is not finite is not applied: the state
    comes back unchanged and the metric `skipped_nonfinite` is 1. `packed_shape`, `objective`: as in
    `make_loss_fn`, with `layout` the plan's (group rows, group offsets) [num_micro,
    groups per micro-batch] (no `layout` without packing). `rest`, the policy's state besides `state.params`
    (read-only: with LoRA the base weights), is the program's first argument, bound (`BoundProgram`).
    """
    o = objective or objective_of(cfg)

    def update(rest, state: TrainState, batch: TrainBatch, layout=None):
        grad_fn = jax.value_and_grad(make_loss_fn(cfg, graphdef, rest, packed_shape, o), has_aux=True)
        flat_mask = batch.completion_mask.reshape(-1, batch.completion_mask.shape[-1])
        denominator = kernels.aggregation_denominator(flat_mask, o.aggregation, max_len=o.max_len)

        def micro_step(carry, inputs):
            grads_acc, loss_acc = carry
            micro, micro_layout = inputs
            (loss, metrics), grads = grad_fn(state.params, micro, denominator, micro_layout)
            tokens = micro.completion_mask.sum()
            weighted = {k: v if k in SUMMED_METRICS else v * tokens for k, v in metrics.items()}
            return (jax.tree.map(jnp.add, grads_acc, grads), loss_acc + loss), (weighted, tokens)

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        (grads, loss), (metrics, tokens) = jax.lax.scan(micro_step, (zeros, jnp.zeros((), jnp.float32)), (batch, layout))
        total_tokens = jnp.maximum(tokens.sum(), 1.0)
        metrics = {k: v.sum() if k in SUMMED_METRICS else v.sum() / total_tokens for k, v in metrics.items()}
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        updated = state._replace(params=params, opt_state=opt_state, step=state.step + 1)
        # A non-finite loss, gradient or result is not applied: one NaN would reach every weight within a
        # step and stay. The select keeps the state bit for bit (its step counter too), inside the update,
        # so the donated buffers hold the right state either way.
        applied = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & all_finite((params, opt_state))
        new_state = jax.tree.map(lambda new, old: jnp.where(applied, new, old), updated, state)
        metrics.update(loss=loss, grad_norm=grad_norm, skipped_nonfinite=1.0 - applied.astype(jnp.float32))
        return new_state, metrics

    in_shardings = (shardings_of(rest), state_sharding, NamedSharding(mesh, P(None, BATCH_AXES)))
    if packed_shape:
        in_shardings += (NamedSharding(mesh, P()),)  # the layout, replicated
    program = jax.jit(
        update,
        in_shardings=in_shardings,
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
        donate_argnums=(1,),
    )
    return BoundProgram(program, rest)


def make_forward_fn(cfg: Config, graphdef, rest) -> BoundProgram:
    """jit(params, tokens, attention, positions, completion_len) -> (log-probs, values) f32[n, C], no gradients.

    Values are zeros without a value head. Scores the reference policy (KL) and the values before an update (GAE).
    `rest` (the policy's state besides `params`) is bound as the program's first argument (`BoundProgram`).
    """

    def forward(rest, params, tokens, attention, positions, completion_len):
        policy = nnx.merge(graphdef, params, rest)
        logp, _, values = completion_outputs(policy, tokens, attention, positions, completion_len,
                                             cfg.sampling.temperature, with_values=cfg.value_head)
        return logp, (values if values is not None else jnp.zeros_like(logp))

    return BoundProgram(jax.jit(forward, static_argnums=(5,)), rest)
