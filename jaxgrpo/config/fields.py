"""The experiment configuration's fields: `Config` and its sections, nested dataclasses with their defaults.

Each field's comment says what it does and which module reads it; assigning a field that does not exist is an
error (`_Fields`). `jaxgrpo.config.overrides` sets fields from the command line and runs experiment files;
`jaxgrpo.config.validation` checks every value.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any

from jaxgrpo import kernels


#: Parameter dtypes a policy can be built in (`jaxgrpo.train.state.build_model`).
DTYPES = ("float32", "bfloat16")
#: The float types optimizer state can be stored in (`OptimizerConfig.state_dtype`).
STATE_DTYPES = ("float32", "bfloat16")
#: Attention implementations `Config.attention` can name (`jaxgrpo.models.attention`: "auto" and its NAMES).
ATTENTION_NAMES = ("auto", "xla", "pallas_tpu", "pallas_gpu", "cpu")
#: What a rematerialized layer keeps (`Config.remat_policy`; `jaxgrpo.models.remat.POLICIES`, the same names: a
#: test keeps them equal).
REMAT_POLICIES = ("full", "save_attention", "save_projections")
#: The projections `LoraConfig.targets` can name: every projection weight of the decoder's blocks
#: (`jaxgrpo.models.config.PROJECTIONS`, the same names; a test keeps them equal).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


#: Fields that became stages (a kernel by name with keyword arguments, like the others), and what to write instead.
#: Setting one is refused with its replacement; a run's config.json that has them is read as the new fields
#: (`migrate`).
REPLACED = {
    "value_head": "advantage='gae' (PPO: GAE over a value head, whose gamma and lam go in advantage_kwargs)",
    "gae_gamma": "advantage_kwargs={'gamma': ...} with advantage='gae'",
    "gae_lambda": "advantage_kwargs={'lam': ...} with advantage='gae'",
    "dynamic_sampling": "group_filter='dynamic_sampling_filter' (DAPO's dynamic sampling; its atol in "
                        "group_filter_kwargs)",
    "overlong_cache_len": "reward_penalty='overlong_penalty' with reward_penalty_kwargs={'cache_len': ...} (DAPO's "
                          "overlong shaping)",
}


#: Fields removed, keyed by (section class, field name), and the one-line error for setting one. A run's config.json
#: that has them reads without them (`migrate`).
REMOVED = {
    ("SamplingConfig", "engine"): "sampling.engine was removed on 2026-12-06: the trainer samples through the rollout "
                                  "engine only (docs/engine.md; `jaxgrpo.sampler.generate`'s fixed batch is gone); "
                                  "drop the setting",
}


def replaced(name: str) -> str | None:
    """The one-line error for setting a field that became a stage, or None for any other name."""
    if name not in REPLACED:
        return None
    return f"{name} is now a stage like the others: set {REPLACED[name]}"


def migrate(values: dict) -> dict:
    """A config dict (config.json) with the fields that became stages rewritten as those stages: a run written
    before keeps reading, resuming and comparing the same."""
    values = dict(values)
    gamma, lam = values.pop("gae_gamma", 1.0), values.pop("gae_lambda", 1.0)
    if values.pop("value_head", False):
        values["advantage"] = "gae"
        values["advantage_kwargs"] = {"gamma": float(gamma), "lam": float(lam)}
    if values.pop("dynamic_sampling", False):
        values["group_filter"] = "dynamic_sampling_filter"
    cache_len = values.pop("overlong_cache_len", 0)
    if cache_len:
        values["reward_penalty"] = "overlong_penalty"
        values["reward_penalty_kwargs"] = {"cache_len": int(cache_len)}
    if isinstance(values.get("sampling"), dict):  # REMOVED: what the run sampled with, not what a reader can redo
        values["sampling"] = {k: v for k, v in values["sampling"].items() if k != "engine"}
    return values


class _Fields:
    """Base of the config sections: assigning an attribute that is not a field is an error.

    A plain dataclass would silently keep `c.group_sise = 4` as a new attribute that
    nothing reads. Copies, pickles and `dataclasses.replace` do not go through
    `__setattr__` with unknown names, so they work as for any dataclass.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__
        if name in REPLACED and name not in fields:
            raise AttributeError(replaced(name))
        if (type(self).__name__, name) in REMOVED:
            raise AttributeError(REMOVED[type(self).__name__, name])
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
    """How completions are sampled during training and held-out evaluation: through the rollout engine
    (`jaxgrpo.engine`: continuous batching over a paged KV cache, one slot per sample of a step, the trainer's
    weights swapped in each step), with these parameters (`jaxgrpo.sampler.SamplingParams`). In a multi-process
    run each process's engine samples its own prompts on its own devices."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 128
    max_prompt_len: int = 256


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
    #: A registered "selection" or "mask" kernel returning bool[N], the rows whose groups are kept, or None: the
    #: other groups are sampled again with new prompts, up to `max_sampling_rounds` rounds in all (DAPO's dynamic
    #: sampling: "dynamic_sampling_filter", which keeps the groups whose correctness varies).
    group_filter: str | None = None
    group_filter_kwargs: dict = dataclasses.field(default_factory=dict)
    max_sampling_rounds: int = 3
    #: A registered "reward" kernel whose f32[N] is added to each scored row's reward, or None (DAPO's overlong
    #: shaping: "overlong_penalty" with {"cache_len": ...}; a kernel's `max_len` defaults to sampling.max_new_tokens).
    reward_penalty: str | None = None
    reward_penalty_kwargs: dict = dataclasses.field(default_factory=dict)
    #: Weight of the value loss. A value head is part of the policy when the advantage reads per-token `values`
    #: (advantage="gae": PPO with GAE over the value head; `Config.value_head`).
    value_coef: float = 0.5

    # Batch shapes.
    prompts_per_step: int = 8
    group_size: int = 8
    #: Inner epochs (mu) over the batch and minibatches per epoch (one optimizer update each).
    num_epochs: int = 1
    num_minibatches: int = 1
    #: Sequences per forward/backward; gradients are accumulated exactly over micro-batches. A micro-batch's rows
    #: split over the mesh's data x fsdp shards, so it is a multiple of their count.
    micro_batch_size: int | None = None
    #: Score each micro-batch as packed prompt groups (jaxgrpo.models.packing): each prompt once, the
    #: completions without padding, untrained rows left out; same log-probs. Minibatches and
    #: micro-batches then hold whole groups (sizes multiples of group_size). A batch whose groups do not each
    #: hold one prompt (hinted samples, episodes that open differently) packs each row on its own. None: the
    #: platform's measured default (`PACKING_BY_PLATFORM`: on for CPU and TPU programs, off on a GPU).
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
    #: With `remat`, what each layer keeps besides its input (`jaxgrpo.models.remat`): "full" recomputes the whole
    #: layer (8 N FLOPs a token); "save_attention" keeps the attention's projections and output, recomputing the
    #: MLP; "save_projections" keeps every projection's output, recomputing only element-wise work (6 N FLOPs a
    #: token, 26.6 KB a token a layer more for Qwen3-0.6B in bfloat16).
    remat_policy: str = "full"
    #: Run the training and scoring forward as one `lax.scan` over the stacked layers (compile time independent of
    #: depth), or, false, the layers one after another (`Decoder(scan_layers=False)`). Compiled for an H100
    #: (Qwen3-0.6B, device_check's update, docs/gpu.md), with `remat_policy=save_projections` the update then
    #: moves 0.89 TB outside the products, against 1.01 for the default and 1.23 scanned (XLA:GPU fills, copies
    #: and transposes a scan's stacks of kept activations), for about twice the compile time; not yet timed on a GPU.
    scan_layers: bool = True

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
    def value_head(self) -> bool:
        """Whether the policy carries a value head: the advantage stage names a kernel reading per-token `values`
        (GAE), which the value head provides and the value loss (`value_coef`) trains."""
        return any("values" in inspect.signature(k.fn).parameters for kind in ("advantage", "token_advantage")
                   for k in kernels.list_kernels(kind) if k.name == self.advantage)

    @property
    def batch_size(self) -> int:
        """Sequences per step: prompts x group size."""
        return self.prompts_per_step * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer update: the step's batch over `num_minibatches`."""
        return self.batch_size // self.num_minibatches

    @property
    def decoder_remat(self) -> bool | str:
        """What `Decoder(remat=...)` takes for this config: False, or the policy the layers keep."""
        return self.remat_policy if self.remat else False

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
    return dataclasses.replace(cfg, packing=PACKING_BY_PLATFORM.get(platform, True))


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)
