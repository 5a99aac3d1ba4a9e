"""`validate(cfg)`: every value of a config checked before anything heavy is built, each error one line.

Types first, then ranges, then how the batch shapes fit together, then the kernels the method names: the
config asks the method's stages (`jaxgrpo.train.stages.check_config`) to check the kernels its fields select.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from typing import Any

from jaxgrpo.config.fields import ATTENTION_NAMES, DTYPES, REMAT_POLICIES, STATE_DTYPES, Config, LoraConfig
from jaxgrpo.errors import ConfigError


def validate(cfg: Config, row_shards: int | None = None) -> None:
    """Checks every value of `cfg` before anything heavy is built; each error names the field and the fix.

    `row_shards`: the mesh's data x fsdp shards, which a micro-batch's rows split over (None: not checked here).

    Types first, then ranges, then how the batch shapes fit together, then the kernels the method
    names (registered names, their keyword arguments against the kernels' signatures, and the values
    against the ranges the kernels declare). Raises `jaxgrpo.errors.ConfigError` (a ValueError).
    """
    _check_types(cfg)
    if cfg.group_size < 1 or cfg.prompts_per_step < 1:
        raise ConfigError(f"group_size and prompts_per_step must be >= 1, got {cfg.group_size} and {cfg.prompts_per_step}")
    _check_ranges(cfg)
    if cfg.batch_size % cfg.num_minibatches:
        raise ConfigError(
            f"batch size prompts_per_step*group_size={cfg.batch_size} is not divisible by "
            f"num_minibatches={cfg.num_minibatches}; change one of them"
        )
    minibatch, micro = cfg.minibatch_size, cfg.micro_batch_rows
    if minibatch % micro:
        raise ConfigError(
            f"minibatch of {minibatch} sequences is not divisible by micro_batch_size={micro}; "
            f"pick a divisor of {minibatch}"
        )
    if cfg.packing and micro % cfg.group_size:
        raise ConfigError(
            f"packing scores whole prompt groups, but micro-batches of {micro} sequences do not hold whole groups "
            f"of group_size={cfg.group_size}; make micro_batch_size (and the minibatch) a multiple of "
            f"{cfg.group_size}, or set packing=false"
        )
    if row_shards is not None:
        check_micro_batch_split(cfg, row_shards)
    if cfg.steps < 0:
        raise ConfigError(f"steps must be >= 0, got {cfg.steps}")
    if cfg.lora is not None:
        _check_lora(cfg.lora)
    if cfg.environment is not None:
        _check_environment(cfg)
    if cfg.guidance is not None:
        _check_guidance(cfg)
    _check_partial(cfg)
    _check_kernels(cfg)


def check_micro_batch_split(cfg: Config, row_shards: int) -> None:
    """A micro-batch's rows split evenly over the mesh's `row_shards` (data x fsdp): the update lays each
    micro-batch's rows over them."""
    micro = cfg.micro_batch_rows
    if micro % row_shards:
        raise ConfigError(
            f"micro-batch of {micro} sequences cannot be split over the mesh's {row_shards} data x fsdp shards; make "
            f"micro_batch_size (and the minibatch, prompts_per_step x group_size / num_minibatches) a multiple of "
            f"{row_shards}, or give fewer devices to data and fsdp (mesh.model)"
        )


def _is_a(value: Any, annotation: Any) -> bool:
    """Whether `value` fits a field annotated `annotation`: an int is a float, a bool is no number."""
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _check_types(cfg: Any, prefix: str = "") -> None:
    """Each field of `cfg` (recursively) holds a value of its annotated type; floats are finite."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, key, annotation = getattr(cfg, f.name), prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(value) and isinstance(value, annotation):
            _check_types(value, key + ".")
            continue
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        allowed = typing.get_args(annotation) if union else (annotation,)
        if not any(_is_a(value, a) for a in allowed):
            names = " or ".join(
                "None" if a is type(None) else "a finite float" if a is float else a.__name__ for a in allowed)
            raise ConfigError(f"{key} must be {names}, got {type(value).__name__} {value!r}")


def _check_ranges(cfg: Config) -> None:
    """Each number lies in the range where it means something."""
    s, o = cfg.sampling, cfg.optimizer
    mesh = {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "model": cfg.mesh.model}
    rules = [
        (s.temperature > 0,
         f"sampling.temperature must be > 0 for training, got {s.temperature}: temperature 0 is greedy sampling, which "
         "makes every completion of a group identical, so group-relative advantages are all zero; use e.g. 1.0 "
         "(greedy decoding is for evaluation)"),
        (s.top_k >= 0, f"sampling.top_k must be >= 0 (0 disables it), got {s.top_k}"),
        (0 < s.top_p <= 1, f"sampling.top_p must be in (0, 1] (1 disables it), got {s.top_p}"),
        (0 <= s.min_p < 1, f"sampling.min_p must be in [0, 1) (0 disables it), got {s.min_p}"),
        (s.max_new_tokens >= 1, f"sampling.max_new_tokens must be >= 1, got {s.max_new_tokens}"),
        (s.max_prompt_len >= 1, f"sampling.max_prompt_len must be >= 1, got {s.max_prompt_len}"),
        (o.lr > 0, f"optimizer.lr must be > 0, got {o.lr}: a negative rate climbs the loss instead of descending it"),
        (0 <= o.b1 < 1, f"optimizer.b1 must be in [0, 1) (Adam's first-moment decay), got {o.b1}"),
        (0 <= o.b2 < 1, f"optimizer.b2 must be in [0, 1) (Adam's second-moment decay), got {o.b2}"),
        (o.eps > 0, f"optimizer.eps must be > 0 (it keeps Adam's division finite), got {o.eps}"),
        (o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {o.weight_decay}"),
        (o.warmup_steps >= 0, f"optimizer.warmup_steps must be >= 0, got {o.warmup_steps}"),
        (o.decay_steps >= 0, f"optimizer.decay_steps must be >= 0 (0 keeps the rate constant), got {o.decay_steps}"),
        (0 <= o.final_lr_fraction <= 1,
         f"optimizer.final_lr_fraction must be in [0, 1] (the decayed rate as a share of lr), got {o.final_lr_fraction}"),
        (o.max_grad_norm > 0,
         f"optimizer.max_grad_norm must be > 0 (the global-norm clipping threshold), got {o.max_grad_norm}"),
        (o.state_dtype in STATE_DTYPES,
         f"optimizer.state_dtype must be one of {', '.join(STATE_DTYPES)}, got {o.state_dtype!r}"),
        (cfg.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}"),
        (cfg.remat_policy in REMAT_POLICIES,
         f"remat_policy must be one of {', '.join(REMAT_POLICIES)}, got {cfg.remat_policy!r}"),
        (cfg.attention in ATTENTION_NAMES,
         f"attention must be one of {', '.join(ATTENTION_NAMES)}, got {cfg.attention!r}"),
        (cfg.num_epochs >= 1, f"num_epochs must be >= 1, got {cfg.num_epochs}"),
        (cfg.num_minibatches >= 1, f"num_minibatches must be >= 1, got {cfg.num_minibatches}"),
        (cfg.micro_batch_size is None or cfg.micro_batch_size >= 1,
         f"micro_batch_size must be >= 1, or none for whole minibatches, got {cfg.micro_batch_size}"),
        (cfg.aggregation_max_len is None or cfg.aggregation_max_len >= 1,
         f"aggregation_max_len must be >= 1, or none for sampling.max_new_tokens, got {cfg.aggregation_max_len}"),
        (cfg.kl_coef >= 0,
         f"kl_coef must be >= 0 (a negative coefficient rewards drifting from the reference), got {cfg.kl_coef}"),
        (cfg.value_coef >= 0, f"value_coef must be >= 0, got {cfg.value_coef}"),
        (cfg.max_sampling_rounds >= 1, f"max_sampling_rounds must be >= 1, got {cfg.max_sampling_rounds}"),
        (0 <= cfg.seed < 2**32, f"seed must be in [0, 2**32) (a JAX PRNG seed), got {cfg.seed}"),
        (cfg.warmup_sft_steps >= 0, f"warmup_sft_steps must be >= 0, got {cfg.warmup_sft_steps}"),
        (cfg.warmup_sft_lr > 0, f"warmup_sft_lr must be > 0, got {cfg.warmup_sft_lr}"),
        (cfg.task.num_eval_examples >= 0,
         f"task.num_eval_examples must be >= 0 (0 = no evaluation), got {cfg.task.num_eval_examples}"),
        (cfg.eval_every >= 0, f"eval_every must be >= 0 (0 = no evaluation), got {cfg.eval_every}"),
        (cfg.eval_pass_k >= 1, f"eval_pass_k must be >= 1, got {cfg.eval_pass_k}"),
        (cfg.checkpoint_every >= 0, f"checkpoint_every must be >= 0 (0 = no checkpoints), got {cfg.checkpoint_every}"),
        (cfg.keep_checkpoints >= 1, f"keep_checkpoints must be >= 1, got {cfg.keep_checkpoints}"),
        (cfg.log_every >= 1, f"log_every must be >= 1, got {cfg.log_every}"),
        (cfg.max_steps_without_signal >= 0,
         f"max_steps_without_signal must be >= 0 (0 = never stop), got {cfg.max_steps_without_signal}"),
        (cfg.max_nonfinite_steps >= 0,
         f"max_nonfinite_steps must be >= 0 (0 = never stop), got {cfg.max_nonfinite_steps}"),
        (cfg.mesh.rollout_devices >= 0,
         f"mesh.rollout_devices must be >= 0 (0 = sampler and learner share the devices), got {cfg.mesh.rollout_devices}"),
        (cfg.mesh.rollout_devices == 0 or cfg.max_staleness >= 1,
         f"mesh.rollout_devices={cfg.mesh.rollout_devices} gives the sampler devices of its own, which only pays "
         "when sampling overlaps learning; set max_staleness=1 (one-step-off), or mesh.rollout_devices=0"),
        (cfg.max_staleness >= 0,
         f"max_staleness must be an integer >= 0 (0 = the synchronous loop, 1 = one-step-off), got "
         f"{cfg.max_staleness!r}"),
        (cfg.partial_rollout_tokens >= 0,
         f"partial_rollout_tokens must be >= 0 (0 = whole completions each step), got {cfg.partial_rollout_tokens}"),
        (cfg.collapse_entropy >= 0, f"collapse_entropy must be >= 0 (0 = no entropy warning), got {cfg.collapse_entropy}"),
        (cfg.collapse_window >= 0, f"collapse_window must be >= 0 (0 = no collapse warnings), got {cfg.collapse_window}"),
        *((size == -1 or size >= 1, f"mesh.{axis} must be -1 (every remaining device) or >= 1, got {size}")
          for axis, size in mesh.items()),
        (list(mesh.values()).count(-1) <= 1, "at most one mesh axis may be -1 (take the remaining devices), got "
         + ", ".join(f"{axis}={size}" for axis, size in mesh.items())),
    ]
    for ok, message in rules:
        if not ok:
            raise ConfigError(message)


def _check_environment(cfg: Config) -> None:
    """An environment run's section, and what single-turn machinery it cannot combine with."""
    from jaxgrpo import envs

    e = cfg.environment
    if e.name not in envs.environment_names():
        raise ConfigError(f"environment.name={e.name!r} is not a registered environment; registered: "
                          f"{', '.join(envs.environment_names())} (or register one with jaxgrpo.envs.register_environment)")
    rules = [(e.max_turns >= 1, f"environment.max_turns must be >= 1, got {e.max_turns}"),
             (e.step_timeout > 0, f"environment.step_timeout must be > 0 seconds, got {e.step_timeout}"),
             (0 <= e.discount <= 1, f"environment.discount must be in [0, 1], got {e.discount}"),
             (e.max_context >= cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens,
              f"environment.max_context={e.max_context} cannot hold a prompt of sampling.max_prompt_len="
              f"{cfg.sampling.max_prompt_len} and one turn of sampling.max_new_tokens={cfg.sampling.max_new_tokens}; "
              f"raise it"),
             (cfg.group_filter is None, f"group_filter={cfg.group_filter!r} does not resample environment episodes "
                                        "yet; set group_filter=None with an environment"),
             (cfg.reward_penalty is None, f"reward_penalty={cfg.reward_penalty!r} penalizes one completion; set it to "
                                          "None with an "
                                          "environment (the episode's token budget is environment.max_context)")]
    for ok, message in rules:
        if not ok:
            raise ConfigError(message)


def _check_partial(cfg: Config) -> None:
    """Partial rollouts (`jaxgrpo.train.partial`): a budget below the length limit, a staleness bound every row can
    end within, single-turn rows."""
    budget, limit = cfg.partial_rollout_tokens, cfg.sampling.max_new_tokens
    if not budget:
        return
    if budget >= limit:
        raise ConfigError(f"partial_rollout_tokens={budget} is not below sampling.max_new_tokens={limit}, so no row "
                          "is ever carried; set it lower, or 0 to sample whole completions")
    if cfg.max_staleness < 2:
        raise ConfigError(f"partial_rollout_tokens={budget} carries a row's tokens to the next update, two updates "
                          f"behind the learner one-step-off; set max_staleness >= 2 (got {cfg.max_staleness})")
    if budget * cfg.max_staleness < limit:
        raise ConfigError(f"partial_rollout_tokens={budget} x max_staleness={cfg.max_staleness} is below "
                          f"sampling.max_new_tokens={limit}: a long row could not end within the staleness bound; "
                          f"raise either so that their product is >= {limit}")
    for on, what in ((cfg.environment is not None, "environment episodes"),
                     (cfg.group_filter is not None, "group_filter"), (cfg.guidance is not None, "guidance"),
                     (cfg.value_head, f"a value head (advantage={cfg.advantage!r})")):
        if on:
            raise ConfigError(f"partial_rollout_tokens={budget} continues single-turn rows only; it does not "
                              f"combine with {what}: set partial_rollout_tokens=0 or turn {what} off")


def _check_guidance(cfg: Config) -> None:
    """Hints for failed groups: their counts, and what they cannot combine with."""
    h = cfg.guidance
    rules = [(h.after_step >= 0, f"guidance.after_step must be >= 0, got {h.after_step}"),
             (h.attempts >= 1, f"guidance.attempts must be >= 1 (hinted samples per tier), got {h.attempts}"),
             (h.replace in ("one", "group"), f"guidance.replace must be 'one' (Scaf-GRPO) or 'group' (GHPO), got "
                                             f"{h.replace!r}"),
             (cfg.environment is None, "guidance hints single-turn prompts; an environment's episodes open with the "
                                       "environment's messages: drop one of guidance and environment")]
    for ok, message in rules:
        if not ok:
            raise ConfigError(message)


def _check_lora(lora: LoraConfig) -> None:
    """LoRA's rank and alpha are positive, its targets projections of the decoder, its quantization one qwix offers."""
    from jaxgrpo.models import lora as lora_lib

    try:
        lora_lib.check(lora.rank, lora.alpha, lora.targets, lora.quantize_base)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _check_kernels(cfg: Config) -> None:
    """The kernels the method names are registered, and their keyword arguments are theirs."""
    from jaxgrpo import kernels
    from jaxgrpo.train import stages

    stages.check_config(cfg)  # every stage: a kernel of its kind, keyword arguments that are its hyper-parameters
    if cfg.aggregation not in kernels.AGGREGATION_MODES:
        raise ConfigError(f"aggregation={cfg.aggregation!r} is not an aggregation mode; valid modes: "
                         f"{', '.join(kernels.AGGREGATION_MODES)}")
