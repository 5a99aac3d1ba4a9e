"""Experiment configuration: nested dataclasses, command-line overrides, experiment files.

An experiment is a small Python file with a `config()` function returning a
`Config`::

    from jaxgrpo.config import Config

    def config() -> Config:
        c = Config()
        c.advantage = "dr_grpo"
        c.aggregation = "seq_mean_token_sum_norm"
        return c

Any field can be overridden on the command line with dotted keys, e.g.
``--set optimizer.lr=1e-6 group_size=8 loss_kwargs.eps_high=0.28``. An unknown
key is an error that lists the valid ones.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import types
import typing
from typing import Any


@dataclasses.dataclass
class TaskConfig:
    """Which task to train on (see `jaxgrpo.data.get_task`)."""

    name: str = "arithmetic"
    kwargs: dict = dataclasses.field(default_factory=dict)
    train_split: str = "train"
    eval_split: str = "test"
    data_dir: str | None = None
    #: Examples of the eval split used for evaluation (0 = no evaluation).
    num_eval_examples: int = 64


@dataclasses.dataclass
class SamplingConfig:
    """How completions are sampled during training (see `jaxgrpo.sampler`)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    max_prompt_len: int = 256


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with linear warm-up then constant learning rate, and global-norm clipping."""

    lr: float = 1e-6
    b1: float = 0.9
    b2: float = 0.99
    #: Adam's epsilon: updates are lr * m / (sqrt(v) + eps), so gradients far below eps barely move a weight.
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


@dataclasses.dataclass
class MeshConfig:
    """Device mesh shape; -1 takes every remaining device."""

    data: int = -1
    fsdp: int = 1
    model: int = 1


@dataclasses.dataclass
class Config:
    """Everything a GRPO-family run needs. Defaults are GRPO's (DeepSeekMath, verl)."""

    # What to train.
    model: str = "smollm2-135m-instruct"
    dtype: str = "float32"
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    #: Reward functions by name (functions of `jaxgrpo.rewards`) and their weights;
    #: empty means the task's default rewards.
    rewards: dict = dataclasses.field(default_factory=dict)
    #: The reward (by function name) that decides "correct", for accuracy and dynamic sampling.
    correctness_reward: str = "correctness_reward"

    # The method: kernels by registry name, with their keyword arguments.
    advantage: str = "grpo"
    advantage_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A registered "mask" kernel removing rows from the loss (e.g. MC-GRPO's pivot), or None.
    loss_mask: str | None = None
    loss: str = "ppo_clip"
    loss_kwargs: dict = dataclasses.field(default_factory=dict)
    aggregation: str = "seq_mean_token_mean"
    #: L_max of the `seq_mean_token_sum_norm` aggregation; defaults to sampling.max_new_tokens.
    aggregation_max_len: int | None = None
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    #: DAPO dynamic sampling: drop groups with all-equal correctness and sample more.
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3
    #: DAPO overlong shaping in tokens (0 disables): penalty in the last `overlong_cache_len` tokens.
    overlong_cache_len: int = 0
    #: PPO with a value head and GAE (the advantage estimator is then unused).
    value_head: bool = False
    value_coef: float = 0.5
    gae_gamma: float = 1.0
    gae_lambda: float = 1.0

    # Batch shapes.
    prompts_per_step: int = 8
    group_size: int = 8
    #: Inner epochs (mu) over the batch and minibatches per epoch (one optimizer update each).
    num_epochs: int = 1
    num_minibatches: int = 1
    #: Sequences per forward/backward; gradients are accumulated exactly over micro-batches.
    micro_batch_size: int | None = None
    #: Score each micro-batch as packed prompt groups (jaxgrpo.models.packing): each prompt once, the
    #: completions without padding, untrained rows left out; same log-probs. Minibatches and
    #: micro-batches then hold whole groups (sizes multiples of group_size).
    packing: bool = True
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    #: Recompute each layer's activations in the backward pass instead of storing them. On by default:
    #: besides the memory, it is faster on CPU, where XLA would otherwise store [layers, tokens, hidden]
    #: activations and write transposed copies of them in the backward pass (benchmarks/profile_step.py).
    remat: bool = True

    # Supervised warm-up on the task's reference answers before RL (0 = none).
    warmup_sft_steps: int = 0
    warmup_sft_lr: float = 1e-3

    # Loop.
    steps: int = 100
    seed: int = 0
    run_dir: str = "runs/default"
    eval_every: int = 0
    eval_pass_k: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    log_every: int = 1
    #: Stop the run (an error) after this many consecutive steps in which no row trains (every reward
    #: invalid, e.g. NaN, or every group filtered out): such a run learns nothing. 0 = never stop.
    max_steps_without_signal: int = 5

    @property
    def batch_size(self) -> int:
        """Sequences per step: prompts x group size."""
        return self.prompts_per_step * self.group_size


# -- overrides -----------------------------------------------------------------------


def valid_keys(cfg: Any, prefix: str = "") -> list[str]:
    """Every dotted key that `--set` accepts for `cfg`."""
    keys = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys.extend(valid_keys(value, prefix + f.name + "."))
        else:
            keys.append(prefix + f.name)
    return keys


def _field_type(cfg: Any, name: str):
    hints = typing.get_type_hints(type(cfg))
    return hints[name]


def _parse_value(text: str, annotation) -> Any:
    """Parses a command-line value according to the field's annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)
    if optional and text.lower() in ("none", "null"):
        return None
    target = args[0] if optional and len(args) == 1 else annotation
    if target is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ValueError(f"expected a boolean (true/false), got {text!r}")
    if target is str:
        return text
    if target in (int, float):
        try:
            return target(ast.literal_eval(text)) if target is float else int(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"expected {target.__name__}, got {text!r}") from None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_override(cfg: Any, key: str, text: str) -> None:
    """Sets the dotted `key` of `cfg` from its command-line text `text`.

    Keys into dict fields (e.g. `loss_kwargs.eps_high`, `rewards.format`) set
    or add that entry, parsed as a Python literal.
    """
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if not last:
                node = node.setdefault(part, {})
                continue
            node[part] = _parse_value(text, Any)
            return
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            raise KeyError(
                f"unknown config key {key!r}; valid keys: {', '.join(valid_keys(cfg))}"
            )
        if last:
            value = getattr(node, part)
            if dataclasses.is_dataclass(value):
                raise KeyError(f"config key {key!r} is a section; set one of its fields, e.g. {key}.{dataclasses.fields(value)[0].name}=...")
            try:
                setattr(node, part, _parse_value(text, _field_type(node, part)))
            except ValueError as e:
                raise ValueError(f"bad value for {key}: {e}") from None
            return
        node = getattr(node, part)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Applies `key=value` overrides in order; returns `cfg` (modified in place)."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. optimizer.lr=1e-6")
        key, text = item.split("=", 1)
        apply_override(cfg, key.strip(), text.strip())
    return cfg


def load_experiment(path: str) -> Config:
    """Runs an experiment file and returns the `Config` its `config()` function builds."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"experiment file {path!r} not found (expected a Python file defining config())")
    name = "jaxgrpo_experiment_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build = getattr(module, "config", None)
    if not callable(build):
        raise AttributeError(f"{path} must define a function config() -> jaxgrpo.config.Config")
    cfg = build()
    if not isinstance(cfg, Config):
        raise TypeError(f"config() in {path} must return a jaxgrpo.config.Config, got {type(cfg).__name__}")
    return cfg


def validate(cfg: Config, num_devices: int | None = None) -> None:
    """Checks that the batch shapes fit together; errors say what to change."""
    if cfg.group_size < 1 or cfg.prompts_per_step < 1:
        raise ValueError(f"group_size and prompts_per_step must be >= 1, got {cfg.group_size} and {cfg.prompts_per_step}")
    if cfg.batch_size % cfg.num_minibatches:
        raise ValueError(
            f"batch size prompts_per_step*group_size={cfg.batch_size} is not divisible by "
            f"num_minibatches={cfg.num_minibatches}; change one of them"
        )
    minibatch = cfg.batch_size // cfg.num_minibatches
    micro = cfg.micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(
            f"minibatch of {minibatch} sequences is not divisible by micro_batch_size={micro}; "
            f"pick a divisor of {minibatch}"
        )
    if cfg.packing and micro % cfg.group_size:
        raise ValueError(
            f"packing scores whole prompt groups, but micro-batches of {micro} sequences do not hold whole groups "
            f"of group_size={cfg.group_size}; make micro_batch_size (and the minibatch) a multiple of "
            f"{cfg.group_size}, or set packing=false"
        )
    if num_devices is not None and micro % num_devices and num_devices % micro:
        raise ValueError(
            f"micro-batch of {micro} sequences cannot be split over {num_devices} devices; "
            f"make micro_batch_size a multiple of {num_devices}"
        )
    if not 0 <= cfg.overlong_cache_len <= cfg.sampling.max_new_tokens:
        raise ValueError(
            f"overlong_cache_len={cfg.overlong_cache_len} must lie in [0, sampling.max_new_tokens="
            f"{cfg.sampling.max_new_tokens}]: the penalty window sits at the end of the completion budget"
        )
    if cfg.steps < 0:
        raise ValueError(f"steps must be >= 0, got {cfg.steps}")
    if cfg.max_steps_without_signal < 0:
        raise ValueError(f"max_steps_without_signal must be >= 0 (0 = never stop), got {cfg.max_steps_without_signal}")


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
