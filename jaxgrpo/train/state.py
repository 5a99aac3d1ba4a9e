"""The train state, everything a checkpoint holds, and how it is built: policy, optimizer, mesh.

`TrainState` is the pytree the jitted update donates and returns. `LoopState` is the loop's whole state
between steps, what a checkpoint holds: the train state with the reference policy (when a KL term needs
one) and the behaviour policy (one-step-off) as arrays; the step, the data position and the RNG key in the
checkpoint's metadata (`save` / `restore`). With LoRA (`Config.lora`) the parameters that train are the
adapters (`trainable`), so the state and a checkpoint hold only them and their optimizer state; the base
weights are rebuilt from the model's source, and the KL reference is the base with the adapters off.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxgrpo import rng
from jaxgrpo.config import DTYPES, Config, OptimizerConfig
from jaxgrpo.train.optimizer_state import stored_as

Array = jax.Array
logger = logging.getLogger(__name__)


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
    """Everything that changes during training (a pytree; donated to the update)."""

    params: Any
    opt_state: Any
    step: Array
    #: The state of stateful kernels by stage, e.g. {"value_tracker": SPOTrackerState} ({} without one).
    kernel_state: Any = {}


def learning_rate(cfg: OptimizerConfig) -> optax.Schedule:
    """The rate per optimizer update: linear warm-up from 0 over `warmup_steps`, then `lr`, decaying along a
    cosine to `lr * final_lr_fraction` over `decay_steps` (when > 0) and staying there."""
    after_warmup = (
        optax.cosine_decay_schedule(cfg.lr, cfg.decay_steps, alpha=cfg.final_lr_fraction)
        if cfg.decay_steps > 0 else optax.constant_schedule(cfg.lr)
    )
    if cfg.warmup_steps == 0:
        return after_warmup
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), after_warmup],
                                [cfg.warmup_steps])


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW at `learning_rate(cfg)`, after global-norm clipping, its moments stored in `cfg.state_dtype`."""
    schedule = learning_rate(cfg)
    return stored_as(cfg.state_dtype, optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    ))


def _toy_tiny(dtype, remat):
    from jaxgrpo.data import toy

    return toy.tiny_model(0, dtype=dtype, remat=remat)


#: Models built by code rather than loaded from a checkpoint: name -> fn(dtype, remat) -> (model, tokenizer).
MODEL_BUILDERS: dict[str, Callable[..., tuple]] = {"toy-tiny": _toy_tiny}


def register_model_builder(name: str, builder: Callable[..., tuple]) -> None:
    """Makes `Config.model = name` build its policy with `builder(dtype=..., remat=...)`."""
    MODEL_BUILDERS[name] = builder


def build_model(cfg: Config):
    """(model, tokenizer) for `cfg.model`: a registered builder, else `jaxgrpo.models.load`; its attention
    implementation is `cfg.attention`, its remat `cfg.decoder_remat`, its layers scanned as `cfg.scan_layers` says."""
    from jaxgrpo import models
    from jaxgrpo.models import attention

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    attention.check_name(cfg.attention)
    dtype = getattr(jnp, cfg.dtype)
    if cfg.model in MODEL_BUILDERS:
        model, tokenizer = MODEL_BUILDERS[cfg.model](dtype=dtype, remat=cfg.decoder_remat)
        model.attention = cfg.attention
    else:
        model, tokenizer = models.load(cfg.model, dtype=dtype, remat=cfg.decoder_remat, attention=cfg.attention)
    model.scan_layers = cfg.scan_layers
    return model, tokenizer


def adapt(model, cfg: Config, mesh=None):
    """`model` with the LoRA of `cfg.lora` (`jaxgrpo.models.lora.apply`: adapters on its projections, the base
    weights quantized under QLoRA), laid out on `mesh` if given; `model` itself without `cfg.lora`."""
    if cfg.lora is None:
        return model
    from jaxgrpo.models import lora

    adapted = lora.apply(model, rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=cfg.lora.targets,
                         quantize_base=cfg.lora.quantize_base,
                         key=rng.stream(rng.run_key(cfg.seed), "adapters"))
    return lora.shard(adapted, mesh) if mesh is not None else adapted


def trainable(cfg: Config):
    """The nnx filter of the policy's parameters that train (`TrainState.params`): every parameter, or with LoRA
    the adapters (and a value head); the rest of the policy's state is read-only."""
    if cfg.lora is None:
        return nnx.Param
    from jaxgrpo.models import lora

    return lora.trainable()


def reference_params(cfg: Config, params):
    """The KL reference's parameters at the start: a copy of `params` with a KL term, None without one. With LoRA
    None too (the reference is the base: the adapters switched off, `reference_of`), unless a supervised warm-up
    will move the adapters first: the reference is then the warmed-up adapters (megabytes)."""
    if not cfg.kl_coef or (cfg.lora is not None and not cfg.warmup_sft_steps):
        return None
    return jax.tree.map(jnp.copy, params)


def reference_of(cfg: Config, params, ref_params):
    """The parameters the KL reference is scored with: `ref_params`, or with LoRA and none kept, `params` with
    every adapter zero (the base model, no second copy of its weights)."""
    if ref_params is not None:
        return ref_params
    if cfg.lora is None:
        raise ValueError("no reference policy: this run has no KL term (kl_coef=0)")
    from jaxgrpo.models import lora

    return lora.adapters_off(params)


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


def split_devices(rollout_devices: int) -> tuple[list, list]:
    """(the learner's devices, the sampler's) of `mesh.rollout_devices`: the last `rollout_devices` devices go to
    the sampler. In a multi-process run each process gives its last `rollout_devices / processes` devices, and
    the sampler's devices are this process's own: each process samples its own prompts on them, with no
    collective between processes (the learner's mesh spans the processes' other devices)."""
    devices, count = jax.devices(), jax.process_count()
    if count == 1:
        return devices[:len(devices) - rollout_devices], devices[len(devices) - rollout_devices:]
    share = rollout_devices // count
    hosts = [[d for d in devices if d.process_index == p] for p in range(count)]
    return [d for host in hosts for d in host[:len(host) - share]], hosts[jax.process_index()][-share:]


def rollout_mesh(devices: Sequence) -> jax.sharding.Mesh:
    """The sampler's own mesh over `devices` (`mesh.rollout_devices`): data-parallel, the learner's axis names."""
    return jax.make_mesh((len(devices), 1, 1), ("data", "fsdp", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)


def process_sampler_mesh(devices: Sequence) -> jax.sharding.Mesh:
    """A process's own sampler mesh over its `devices` in a multi-process run (`preflight.samples_locally`): the
    weights split over them (`fsdp`, by their logical axes) rather than whole on each, since a model the learner
    splits over every chip of the slice may not fit one chip whole; the sampler's rows split over them too."""
    devices = sorted(devices, key=lambda d: d.id)
    return jax.sharding.Mesh(np.array(devices).reshape(1, len(devices), 1), ("data", "fsdp", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)


def hosts_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """`mesh`'s devices as one row per process, axes ("hosts", "fsdp", "model"): parameters laid out on it by their
    logical axes are whole on every process and split over each process's devices (no rule names "hosts")."""
    devices = sorted(mesh.devices.flat, key=lambda d: (d.process_index, d.id))
    processes = len({d.process_index for d in devices})
    if len(devices) % processes:
        raise ValueError(f"the mesh's {len(devices)} devices do not split evenly over its {processes} processes")
    return jax.sharding.Mesh(np.array(devices).reshape(processes, -1, 1), ("hosts", "fsdp", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)


def process_copy(tree, mesh: jax.sharding.Mesh):
    """A tree of parameters laid out on `mesh` (spanning the processes) as this process's own copy, split over its
    devices of `mesh` (`process_sampler_mesh` of them): one collective of `mesh` lays the tree out on `hosts_mesh`
    (a whole copy per process, each split over the process's devices), whose shards on this process's devices are
    then its copy, as they are. No device holds the whole tree (as a gather to every device would)."""
    from jaxgrpo.models import partitioning

    hosts = hosts_mesh(mesh)
    spread = partitioning.place_state(tree, hosts)
    row = next(r for r in hosts.devices if r.flat[0].process_index == jax.process_index())
    local = process_sampler_mesh(list(row.flat))

    def local_array(x):
        sharding = jax.sharding.NamedSharding(local, x.sharding.spec)
        return jax.make_array_from_single_device_arrays(x.shape, sharding, [s.data for s in x.addressable_shards])

    return jax.tree.map(local_array, spread)


def init_state(params, optimizer: optax.GradientTransformation, mesh) -> TrainState:
    """The state at step 0 for `params` laid out on `mesh`: every leaf on the mesh, scalars replicated,
    so the jitted update sees one input type."""
    from jaxgrpo.distributed import on_mesh

    with jax.set_mesh(mesh):
        opt_state = optimizer.init(params)
    return on_mesh(TrainState(params, opt_state, jnp.zeros((), jnp.int32)), mesh)


class _CheckpointedTrain(NamedTuple):
    """The train state less its kernel state, laid out as checkpoints held it before stateful kernels."""

    params: Any
    opt_state: Any
    step: Array


def checkpoint_tree(state: LoopState) -> dict:
    """The arrays a checkpoint of `state` holds: the train state, stateful kernels' state when there is some,
    the reference policy when there is one, and the behaviour policy's parameters under one-step-off (so
    checkpoints of runs without them restore as they always did)."""
    train = state.train
    return {"train": _CheckpointedTrain(train.params, train.opt_state, train.step),
            **({"kernel_state": train.kernel_state} if train.kernel_state else {}),
            **({"ref": state.reference} if state.reference is not None else {}),
            **({"behaviour": state.behaviour} if state.behaviour is not None else {})}


def state_of(tree: dict) -> TrainState:
    """The `TrainState` of a restored `checkpoint_tree`."""
    return TrainState(*tree["train"], kernel_state=tree.get("kernel_state", {}))


class Partial(NamedTuple):
    """Partial rollouts (`jaxgrpo.train.partial`): the groups a step left unfinished, continued by the next
    step (numpy; `rows` = groups x group size)."""

    positions: np.ndarray  # i64[groups]: each group's example, by its position in the prompt stream
    carries: np.ndarray  # i32[groups]: steps the group has been carried so far (>= 1)
    tokens: np.ndarray  # i32[rows, C]: each row's completion so far (C = sampling.max_new_tokens), 0-padded
    lengths: np.ndarray  # i32[rows]
    logp: np.ndarray  # f32[rows, C]: each token's log-prob under the policy that sampled it
    versions: np.ndarray  # i32[rows, C]: the policy version of each token, -1 on padding
    stopped: np.ndarray  # bool[rows]: the row ended on a stop token

    @property
    def done(self) -> np.ndarray:
        """bool[rows]: the row ended, on a stop token or at the length limit (a group that may not be carried
        again ends this step, so a carried row that ended did one of these)."""
        return self.stopped | (self.lengths >= self.tokens.shape[1])

    def to_json(self) -> dict:
        """The checkpoint metadata's form (exact: float32 log-probs round-trip through JSON's doubles)."""
        return {name: np.asarray(value).tolist() for name, value in self._asdict().items()}

    @classmethod
    def from_json(cls, data: dict) -> "Partial":
        dtypes = {"positions": np.int64, "carries": np.int32, "tokens": np.int32, "lengths": np.int32,
                  "logp": np.float32, "versions": np.int32, "stopped": bool}
        return cls(**{name: np.asarray(data[name], dtype) for name, dtype in dtypes.items()})


class LoopState(NamedTuple):
    """The training loop's whole state between two steps: exactly what a checkpoint holds.

    `Trainer.step(loop_state) -> (loop_state, metrics)` is a function of it (with the trainer's fixed parts:
    the config, the compiled programs, the data, the task), so a run restored from a checkpoint continues as
    the uninterrupted run would. Environment episodes begin and end within a step (`multi_turn.rollout`), so
    between two steps no environment is live: its state is the data position (which examples come next) and
    the key (how they are sampled); a step killed midway is run again from the same state, identically.
    """

    train: TrainState  # the policy's trainable parameters, their optimizer state and kernel state (donated to updates)
    reference: Any  # the KL reference's parameters, None without a copy (no KL term, or LoRA's base: `reference_of`)
    data_position: int  # examples of the prompt stream consumed (`PromptStream.at`)
    key: Array  # the run's key (`rng.run_key(seed)`): step t samples with `rng.stream(key, "sample", t)`
    step: int = 0  # RL steps done (`train.step` counts the optimizer's updates)
    #: One-step-off (`Config.max_staleness` >= 1): the trainable parameters of the policy that samples this
    #: step's rollout, one update behind `train` (the initial ones at step 0); None in the synchronous loop.
    behaviour: Any = None
    #: Partial rollouts (`Config.partial_rollout_tokens`): the groups the last rollout left unfinished, which the
    #: next continues (`Partial`, numpy; in the checkpoint's metadata); None without any.
    partial: Any = None


def save(checkpointer, state: LoopState) -> None:
    """Saves a `LoopState` under its step: its arrays (`checkpoint_tree`), the step, data position, RNG key and
    the partial rollouts' carried groups in the metadata."""
    meta = {"step": state.step, "data_position": state.data_position,
            "rng_key_data": np.asarray(jax.random.key_data(state.key)).tolist(),
            **({"partial": state.partial.to_json()} if state.partial is not None else {})}
    checkpointer.save(state.step, checkpoint_tree(state), meta)


def restore(checkpointer, like: LoopState) -> LoopState | None:
    """The newest checkpoint that restores into the structure of `like`, or None without one.

    Damaged newer checkpoints are skipped with one warning naming them (`Checkpointer.restore_newest`).
    """
    found = checkpointer.restore_newest(checkpoint_tree(like))
    if found is None:
        return None
    step, restored, meta, skipped = found
    if skipped and jax.process_index() == 0:
        logger.warning("checkpoint(s) in %s did not restore and were moved to %s; resumed from step %d: %s",
                       checkpointer.directory, checkpointer.damaged_directory, step,
                       "; ".join(f"step {s}: {r}" for s, r in skipped))
    return loop_state_of(restored, meta, like)


def loop_state_of(tree: dict, meta: dict, like: LoopState) -> LoopState:
    """The `LoopState` of a restored `checkpoint_tree` of `like` and its checkpoint's metadata (`save`'s)."""
    key = jax.random.wrap_key_data(np.asarray(meta["rng_key_data"], np.uint32))
    return LoopState(state_of(tree), tree.get("ref") if like.reference is not None else None,
                     int(meta["data_position"]), key, int(meta["step"]),
                     tree.get("behaviour") if like.behaviour is not None else None,
                     Partial.from_json(meta["partial"]) if meta.get("partial") is not None else None)
