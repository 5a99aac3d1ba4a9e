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
key is an error that lists the valid ones, and so is assigning a field that does
not exist (``c.group_sise = 4``). `validate` checks every value before anything
heavy is built.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import math
import numbers
import os
import traceback
import types
import typing
from typing import Any

from jaxgrpo.errors import ConfigError, UserError

#: Parameter dtypes a policy can be built in (`jaxgrpo.train.state.build_model`).
DTYPES = ("float32", "bfloat16")
#: The float types optimizer state can be stored in (`OptimizerConfig.state_dtype`).
STATE_DTYPES = ("float32", "bfloat16")
#: Attention implementations `Config.attention` can name (`jaxgrpo.models.attention`: "auto" and its NAMES).
ATTENTION_NAMES = ("auto", "xla", "pallas_tpu", "pallas_gpu", "cpu")
#: The projections `LoraConfig.targets` can name: every projection weight of the decoder's blocks
#: (`jaxgrpo.models.config.PROJECTIONS`, the same names; a test keeps them equal).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


class _Fields:
    """Base of the config sections: assigning an attribute that is not a field is an error.

    A plain dataclass would silently keep `c.group_sise = 4` as a new attribute that
    nothing reads. Copies, pickles and `dataclasses.replace` do not go through
    `__setattr__` with unknown names, so they work as for any dataclass.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__
        if name not in fields and not isinstance(getattr(type(self), name, None), property):
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid fields: {', '.join(fields)}"
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; {hint}")
        super().__setattr__(name, value)


@dataclasses.dataclass
class TaskConfig(_Fields):
    """Which task to train on (see `jaxgrpo.data.get_task`)."""

    name: str = "arithmetic"
    kwargs: dict = dataclasses.field(default_factory=dict)
    train_split: str = "train"
    eval_split: str = "test"
    data_dir: str | None = None
    #: Examples of the eval split used for evaluation (0 = no evaluation).
    num_eval_examples: int = 64


@dataclasses.dataclass
class SamplingConfig(_Fields):
    """How completions are sampled during training (see `jaxgrpo.sampler`)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    max_prompt_len: int = 256
    #: Sample through the rollout engine (`jaxgrpo.engine`: continuous batching over a paged KV cache, one slot
    #: per sample of a step, the trainer's weights swapped in each step) instead of `sampler.generate`'s fixed
    #: batch; training and held-out evaluation both. Both draw a token with the same key (its prompt id, sample
    #: and index in the completion), so they sample the same tokens wherever their logits agree. In a
    #: multi-process run each process's engine samples its own prompts on its own devices; dynamic sampling
    #: and guidance, whose rounds are agreed across processes, need `false` there.
    engine: bool = False


@dataclasses.dataclass
class OptimizerConfig(_Fields):
    """AdamW with global-norm clipping; the learning rate warms up linearly, then stays constant or decays."""

    lr: float = 1e-6
    b1: float = 0.9
    b2: float = 0.99
    #: Adam's epsilon: updates are lr * m / (sqrt(v) + eps), so gradients far below eps barely move a weight.
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    #: Optimizer updates over which the rate decays after the warm-up, along a cosine from `lr` to
    #: `lr * final_lr_fraction`, and stays there; 0 keeps it constant at `lr`.
    decay_steps: int = 0
    final_lr_fraction: float = 0.0
    max_grad_norm: float = 1.0
    #: The float type Adam's moments are kept in between steps (`STATE_DTYPES`); they are
    #: updated in float32 either way. "bfloat16" halves their memory (8 -> 4 bytes per parameter).
    state_dtype: str = "float32"


@dataclasses.dataclass
class LoraConfig(_Fields):
    """LoRA ("LoRA: Low-Rank Adaptation of Large Language Models", Hu et al. 2021) on the decoder's projections,
    with qwix (`jaxgrpo.models.lora`): only the adapters train (and are checkpointed); the base weights are read-only,
    stored quantized under QLoRA ("QLoRA", Dettmers et al. 2023). Defaults: every projection, rank 16, alpha 32."""

    #: The adapters' inner dimension r.
    rank: int = 16
    #: Each adapted product adds (alpha / rank) x A B.
    alpha: float = 32.0
    #: The projections to adapt (`LORA_TARGETS`): attention's q, k, v, o and the MLP's gate, up, down.
    targets: tuple = LORA_TARGETS
    #: None, or how to store the base weights: "int8" or "nf4" (4-bit NormalFloat, in blocks of 64), qwix's; QLoRA.
    quantize_base: str | None = None


@dataclasses.dataclass
class EnvironmentConfig(_Fields):
    """Multi-turn episodes of a registered environment (`jaxgrpo.envs`) instead of one completion per sample:
    each step's G episodes of a prompt run through the rollout engine in token space
    (`jaxgrpo.engine.multi_turn`), the policy's turns of `sampling.max_new_tokens` tokens each; the loss sees
    only the policy's tokens, the reward is the episode's (the sum of its turns'). The task provides the
    examples the environment's `reset` reads; its rewards are not used."""

    #: A registered environment (`jaxgrpo.envs.environment_names()`).
    name: str = "calculator"
    #: Keyword arguments of the environment's factory.
    kwargs: dict = dataclasses.field(default_factory=dict)
    #: Policy turns per episode.
    max_turns: int = 4
    #: Positions an episode may use: its opening, every turn and every observation.
    max_context: int = 1024
    #: Seconds an environment's step may take before its episode ends with the environment's failure reward.
    step_timeout: float = 10.0
    #: gamma of the step returns a turn's credit reads (`step_returns`: sum_k gamma^k r_{t+k}; 0.95 as verl-agent).
    discount: float = 0.95


@dataclasses.dataclass
class GuidanceConfig(_Fields):
    """Scaf-GRPO's scaffolding (`jaxgrpo.train.guidance`): for a prompt whose samples all failed, its hints (the
    task's `hints(example)` or the examples' "hints", most abstract first) are tried tier by tier, `attempts`
    samples each, and the first correct hinted sample replaces one of the group's (its prompt holds the hint)."""

    #: Steps of independent learning before any hint (Scaf-GRPO guides once learning alone has plateaued).
    after_step: int = 0
    #: Hinted samples per failed prompt and tier (with replace="one"; "group" samples a whole group).
    attempts: int = 1
    #: "one": the first correct hinted sample replaces one of the group's (Scaf-GRPO); "group": the first hinted
    #: group of G with a correct sample replaces the whole group (GHPO's prompt refinement).
    replace: str = "one"


@dataclasses.dataclass
class MeshConfig(_Fields):
    """Device mesh shape; -1 takes every remaining device."""

    data: int = -1
    fsdp: int = 1
    model: int = 1
    #: Devices (the last ones) that only sample, on a mesh of their own (data-parallel); the learner's mesh
    #: (`data`, `fsdp`, `model` above) takes the others. The behaviour policy's weights go to them by
    #: device-to-device transfer after each update. 0: sampler and learner time-share every device.
    rollout_devices: int = 0


@dataclasses.dataclass
class Config(_Fields):
    """Everything a GRPO-family run needs. Defaults are GRPO's (DeepSeekMath, verl)."""

    # What to train.
    model: str = "smollm2-135m-instruct"
    dtype: str = "float32"
    #: The training/scoring attention implementation (jaxgrpo.models.attention): "auto" picks splash
    #: attention on a TPU, the Pallas flash kernel on a GPU and the CPU kernels on a CPU; "xla",
    #: "pallas_tpu", "pallas_gpu" or "cpu" choose one.
    attention: str = "auto"
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    #: Reward functions by name (functions of `jaxgrpo.rewards`) and their weights;
    #: empty means the task's default rewards.
    rewards: dict = dataclasses.field(default_factory=dict)
    #: The reward (by function name) that decides "correct", for accuracy and dynamic sampling.
    correctness_reward: str = "correctness_reward"

    # The method: kernels by registry name, with their keyword arguments, one per stage of the step
    # (jaxgrpo.train.stages): loss mask -> reward shaping -> advantage -> token credit -> row weights -> loss
    # (+ KL, entropy, value).
    #: A registered "reward" kernel whose output replaces the rewards before the advantage, or None.
    reward_shaping: str | None = None
    reward_shaping_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A registered "advantage" (per row) or "token_advantage" (per token) kernel.
    advantage: str = "grpo"
    advantage_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A registered "credit" kernel: per-token weights of the advantages (or new advantages), or None.
    token_credit: str | None = None
    token_credit_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A registered "selection" kernel weighting each row's (or group's) advantages, or None.
    row_weights: str | None = None
    row_weights_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A registered "mask" kernel removing rows from the loss (e.g. MC-GRPO's pivot), or None.
    loss_mask: str | None = None
    loss_mask_kwargs: dict = dataclasses.field(default_factory=dict)
    #: A stateful kernel tracking a value per prompt across steps (e.g. SPO's tracker, which provides the
    #: `baseline` its advantage reads), its state kept in the train state (jaxgrpo.train.trackers), or None.
    value_tracker: str | None = None
    value_tracker_kwargs: dict = dataclasses.field(default_factory=dict)
    loss: str = "ppo_clip"
    loss_kwargs: dict = dataclasses.field(default_factory=dict)
    aggregation: str = "seq_mean_token_mean"
    #: L_max of the `seq_mean_token_sum_norm` aggregation; defaults to sampling.max_new_tokens.
    aggregation_max_len: int | None = None
    #: Weight of the KL penalty to the reference policy (0: no KL term, no reference policy kept).
    kl_coef: float = 0.0
    #: The KL stage: a registered "kl" estimator and its keyword arguments (e.g. {"clamp": 10.0}, verl's).
    kl_kind: str = "k3"
    kl_kwargs: dict = dataclasses.field(default_factory=dict)
    entropy_coef: float = 0.0
    #: DAPO dynamic sampling: drop groups with all-equal correctness and sample more.
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3
    #: DAPO overlong shaping in tokens (0 disables): penalty in the last `overlong_cache_len` tokens.
    overlong_cache_len: int = 0
    #: PPO with a value head and GAE: GAE is the advantage, so the host stages (reward_shaping, advantage,
    #: token_credit, row_weights) stay at their defaults (another is refused, not ignored).
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
    #: micro-batches then hold whole groups (sizes multiples of group_size). None: the platform's
    #: measured default (`PACKING_BY_PLATFORM`: on for CPU and TPU programs, off on a GPU).
    packing: bool | None = None
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    #: LoRA / QLoRA on the decoder's projections (`LoraConfig`), or None to train every parameter. The KL
    #: reference is then the base model with the adapters switched off.
    lora: LoraConfig | None = None
    #: Multi-turn episodes of an environment (`EnvironmentConfig`), or None for one completion per sample scored
    #: by the task's rewards.
    environment: EnvironmentConfig | None = None
    #: In-prompt hints for prompts whose samples all failed (`GuidanceConfig`, Scaf-GRPO), or None.
    guidance: GuidanceConfig | None = None
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
    #: Write every this many steps' metrics to metrics.jsonl and TensorBoard (and the last step's); the run's
    #: checks (no signal, non-finite updates, collapse) see every step's.
    log_every: int = 1
    #: Stop the run (an error) after this many consecutive steps in which no row trains (every reward
    #: invalid, e.g. NaN, or every group filtered out): such a run learns nothing. 0 = never stop.
    max_steps_without_signal: int = 5
    #: Stop the run (an error) after this many consecutive steps with an update that was not applied because
    #: its loss, gradient norm or result was not finite (each such update is skipped, the state kept as it was,
    #: and warned about). 0 = never stop.
    max_nonfinite_steps: int = 3
    #: Asynchronous rollouts: the most policy updates a trained token may lag the learner by. 0: the synchronous
    #: loop (a step samples, then learns, with the same weights). >= 1: one-step-off, a step's learning overlapping
    #: the next step's sampling in a thread of its own, by the policy before the update (every trained token one
    #: update stale, the first step's none). The PPO ratio is then taken against the learner's own log-probs
    #: before the update (one forward more); the sampler's are the behaviour's, which a correction stage reads
    #: (`token_credit="importance_correction"`: TIS / MIS).
    max_staleness: int = 0
    #: Partial rollouts (Kimi k1.5): the most new tokens a row gets per step (0: off, whole completions). A group
    #: with a row still going is carried to the next step (kept out of the loss) and continued there by the
    #: updated policy; each token keeps the version that sampled it (`Trajectories.token_versions`). A group is
    #: carried at most max_staleness - 1 times, so it needs max_staleness >= 2 (one-step-off) and
    #: partial_rollout_tokens x max_staleness >= sampling.max_new_tokens (`jaxgrpo.train.partial`).
    partial_rollout_tokens: int = 0
    #: Collapse warnings (`jaxgrpo.train.health`), each given once: the mean token entropy (nats) of the last
    #: `collapse_window` steps is below `collapse_entropy` while their accuracy is no better than the first
    #: `collapse_window` steps', or every completion of `collapse_window` steps in a row ran to the token cap.
    #: collapse_entropy=0 turns the entropy sign off; collapse_window=0 both.
    collapse_entropy: float = 0.1
    collapse_window: int = 5

    @property
    def batch_size(self) -> int:
        """Sequences per step: prompts x group size."""
        return self.prompts_per_step * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer update: the step's batch over `num_minibatches`."""
        return self.batch_size // self.num_minibatches

    @property
    def micro_batch_rows(self) -> int:
        """Sequences per forward and backward: `micro_batch_size`, or the whole minibatch when it is 0."""
        return self.micro_batch_size or self.minibatch_size


#: `Config.packing=None` per platform, as measured (docs/gpu.md). A CPU scores packed rows faster (each prompt
#: once). On an H100 (Qwen3-0.6B, 16 x 8 rows, 256 + 512 tokens, bfloat16, flash attention `pallas_gpu`) the
#: unpacked update took 2.52 s and the packed one 3.33 s: off on a GPU. TPU programs keep it on (splash
#: attention skips the masked blocks; no TPU run measured yet).
PACKING_BY_PLATFORM = {"cpu": True, "gpu": False, "tpu": True}


def resolve_packing(cfg: Config, platform: str) -> Config:
    """`cfg` with `packing` set: as given, or (None) the measured default of `platform` ("cpu", "gpu", "tpu")."""
    if cfg.packing is not None:
        return cfg
    if cfg.environment is not None or (cfg.guidance is not None and cfg.guidance.replace == "one"):
        # Episodes' observations sit inside their completions, a hinted sample's prompt is not its group's: a
        # packed row holds one prompt for its group.
        return dataclasses.replace(cfg, packing=False)
    return dataclasses.replace(cfg, packing=PACKING_BY_PLATFORM.get(platform, True))


# -- overrides -----------------------------------------------------------------------


def optional_section(cfg: Any, name: str) -> type | None:
    """The section type of `cfg`'s field `name` when the field is an optional section (e.g. `Config.lora`:
    `LoraConfig | None`), else None."""
    annotation = _field_type(cfg, name)
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    sections = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
    return sections[0] if len(sections) == 1 and type(None) in typing.get_args(annotation) else None


def valid_keys(cfg: Any, prefix: str = "") -> list[str]:
    """Every dotted key that `--set` accepts for `cfg` (the fields of an optional section that is None too)."""
    keys = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        section = optional_section(cfg, f.name)
        if value is None and section is not None:
            keys.append(prefix + f.name)
            value = section()
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
    or add that entry, parsed as a Python literal. A key into an optional section that is None (e.g.
    `lora.rank` without LoRA) creates the section with its defaults first.
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
            if optional_section(node, part) is not None and text.lower() in ("none", "null"):
                setattr(node, part, None)  # an optional section switched off, e.g. lora=none
                return
            if dataclasses.is_dataclass(value):
                raise KeyError(f"config key {key!r} is a section; set one of its fields, e.g. {key}.{dataclasses.fields(value)[0].name}=...")
            try:
                setattr(node, part, _parse_value(text, _field_type(node, part)))
            except ValueError as e:
                raise ValueError(f"bad value for {key}: {e}") from None
            return
        if getattr(node, part) is None and (section := optional_section(node, part)) is not None:
            setattr(node, part, section())
        node = getattr(node, part)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Applies `key=value` overrides in order; returns `cfg` (modified in place)."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. optimizer.lr=1e-6")
        key, text = item.split("=", 1)
        apply_override(cfg, key.strip(), text.strip())
    return cfg


class ExperimentError(UserError):
    """An experiment file failed to run: its message names the file, the line and the error."""


def _error_in_file(error: BaseException, path: str) -> ExperimentError:
    """`error`, raised while running the experiment file `path`, as one line pointing into that file."""
    here = os.path.abspath(path)
    if isinstance(error, SyntaxError) and os.path.abspath(error.filename or "") == here:
        return ExperimentError(f"{path} line {error.lineno}: {error.msg}")
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if os.path.abspath(frame.filename) == here]
    where = f"{path} line {lines[-1]}" if lines else path
    message = " ".join(str(error).splitlines())  # one line, whatever the user's exception says
    return ExperimentError(f"{where}: {type(error).__name__}: {message}")


def load_experiment(path: str) -> Config:
    """Runs an experiment file and returns the `Config` its `config()` function builds.

    An exception raised by the file's own code (a syntax error, a misspelt field, a
    KeyError in `config()`) becomes an `ExperimentError` naming the file and line.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"experiment file {path!r} not found (expected a Python file defining config())")
    name = "jaxgrpo_experiment_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise _error_in_file(e, path) from e
    build = getattr(module, "config", None)
    if not callable(build):
        raise AttributeError(f"{path} must define a function config() -> jaxgrpo.config.Config")
    try:
        cfg = build()
    except Exception as e:
        raise _error_in_file(e, path) from e
    if not isinstance(cfg, Config):
        raise TypeError(f"config() in {path} must return a jaxgrpo.config.Config, got {type(cfg).__name__}")
    return cfg


def validate(cfg: Config, num_devices: int | None = None) -> None:
    """Checks every value of `cfg` before anything heavy is built; each error names the field and the fix.

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
    if num_devices is not None and micro % num_devices and num_devices % micro:
        raise ConfigError(
            f"micro-batch of {micro} sequences cannot be split over {num_devices} devices; "
            f"make micro_batch_size a multiple of {num_devices}"
        )
    if not 0 <= cfg.overlong_cache_len <= cfg.sampling.max_new_tokens:
        raise ConfigError(
            f"overlong_cache_len={cfg.overlong_cache_len} must lie in [0, sampling.max_new_tokens="
            f"{cfg.sampling.max_new_tokens}]: the penalty window sits at the end of the completion budget"
        )
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
        (0 <= cfg.gae_gamma <= 1, f"gae_gamma must be in [0, 1], got {cfg.gae_gamma}"),
        (0 <= cfg.gae_lambda <= 1, f"gae_lambda must be in [0, 1], got {cfg.gae_lambda}"),
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
             (not cfg.packing, "packing lays out a prompt and one completion per row, but an episode's observations "
                               "sit inside its completion; set packing=false (or leave it None) with an environment"),
             (not cfg.dynamic_sampling, "dynamic_sampling does not resample environment episodes yet; set "
                                        "dynamic_sampling=false with an environment"),
             (not cfg.overlong_cache_len, "overlong_cache_len penalizes one completion's length; set it to 0 with an "
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
                     (cfg.dynamic_sampling, "dynamic_sampling"), (cfg.guidance is not None, "guidance"),
                     (cfg.value_head, "value_head")):
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
                                       "environment's messages: drop one of guidance and environment"),
             (not cfg.packing or h.replace == "group",
              "a hinted sample's prompt differs from its group's, but packing lays out one prompt per group; set "
              "packing=false (or leave it None) with guidance.replace='one'")]
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


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
