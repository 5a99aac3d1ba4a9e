"""The step's stages, each a kind of registered kernel the experiment picks by name with keyword arguments.

    loss mask -> reward shaping -> advantage -> token credit -> row weights -> policy loss (+ KL, entropy, value)
    -> aggregation

| stage (config field) | kernel kinds | what its output does |
|---|---|---|
| `reward_shaping` | reward | f32[N] replaces the rewards the advantage stage reads |
| `advantage` | advantage, token_advantage | f32[N] (broadcast over tokens) or f32[N, T]: the advantages; a kernel reading an environment run's step fields (`anchor_ids`, `step_returns`: GiGPO) gets one row per policy turn and each turn's tokens its value |
| `token_credit` | credit | f32[N, T]: new advantages if the kernel reads `advantages`, else weights multiplying them |
| `row_weights` | selection | f32[N] or f32[num_groups] (per group): weights multiplying each row's advantages |
| `loss` | loss | the per-token policy loss; fields beyond (logp, old_logp, advantages, mask) by name |
| `loss_mask` | mask | bool[N]: rows the loss sees (a mask of the batch's rewards and groups) |
| `kl_kind` (`kl_kwargs`) | kl | the per-token KL to the reference, weighted by `kl_coef` in the loss (on when > 0) |
| `value_tracker` | selection (a tracker) | a state per prompt, kept in the train state; provides `baseline` |
| `reward_penalty` | reward | f32[N] added to each scored row's reward as it is sampled (DAPO's overlong shaping) |
| `group_filter` | selection, mask | bool[N]: the rows whose groups are kept, the others sampled again (DAPO) |

The advantage stage also decides whether the policy has a value head: an advantage reading per-token `values`
(`gae`) gets one, trained by the value loss (`Config.value_head`), and the host stages around it keep their
defaults (GAE over the value head is the whole advantage).

Each kernel reads the fields its signature names (`jaxgrpo.train.inputs`). `check_config` refuses a
stage given a kernel of the wrong kind, a kernel whose registration declares it cannot run in the
loop (`KernelInfo.loop`), unknown keyword arguments, and keyword arguments of the wrong type or outside the
range the kernel's registration declares (`KernelInfo.ranges`), from the config alone; `check_fields`
refuses a kernel reading a field the run cannot provide (with the task's examples). Both run before
anything is compiled.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from jaxgrpo import kernels
from jaxgrpo.errors import ConfigError
from jaxgrpo.train import inputs as inputs_lib, trackers

if TYPE_CHECKING:  # a type only: the config validates its stages (`check_config`), not the other way round
    from jaxgrpo.config.fields import Config


class Stage(NamedTuple):
    field: str  # the config field naming the kernel
    kinds: tuple[str, ...]
    kwargs: str = ""  # the config field of its keyword arguments ("" : field + "_kwargs")
    #: The fields the stage passes its kernel (None: any field the run provides).
    passes: tuple[str, ...] | None = None
    #: (keyword argument, dotted config field): a kernel's argument of that name the experiment does not set is
    #: the config's value (e.g. a length penalty's `max_len` is the sampler's `max_new_tokens`).
    defaults: tuple[tuple[str, str], ...] = ()

    @property
    def kwargs_field(self) -> str:
        return self.kwargs or self.field + "_kwargs"


#: What the loss_mask stage passes its kernel: the whole batch's row statistics, before the host stages.
ROW_MASK_INPUTS = ("rewards", "group_ids", "num_groups", "valid")

STAGES = (
    Stage("reward_shaping", ("reward",)),
    Stage("advantage", ("advantage", "token_advantage")),
    Stage("token_credit", ("credit",)),
    Stage("row_weights", ("selection",)),
    Stage("loss", ("loss",)),
    Stage("loss_mask", ("mask",), passes=ROW_MASK_INPUTS),
    Stage("kl_kind", ("kl",), kwargs="kl_kwargs", passes=("logp", "ref_logp", "old_logp", "mask")),
    Stage("value_tracker", ("selection",), passes=("state", "prompt_ids", "rewards", "kl", "valid")),
    Stage("reward_penalty", ("reward",), passes=("lengths", "correct", "group_ids", "num_groups", "valid"),
          defaults=(("max_len", "sampling.max_new_tokens"),)),
    # The filter's `rewards` are each row's correctness (`correctness_reward`): DAPO keeps groups by accuracy.
    Stage("group_filter", ("selection", "mask"), passes=ROW_MASK_INPUTS),
)
STAGE = {stage.field: stage for stage in STAGES}

#: Stages computed on the host before the update (the loss runs inside it).
HOST_STAGES = ("reward_shaping", "advantage", "token_credit", "row_weights")
#: The fields a policy loss may read besides (logp, old_logp, advantages, mask) (`step.make_loss_fn`).
LOSS_FIELDS = ("entropy", "num_groups", *inputs_lib.LOSS_ROW_FIELDS)


def kwargs_of(cfg: Config, stage: Stage, kernel=None) -> dict:
    """The keyword arguments a stage gives its kernel (`kernel`, when the caller has looked it up): the
    experiment's, with the stage's `defaults` for the arguments of the kernel the experiment leaves unset."""
    kwargs = dict(getattr(cfg, stage.kwargs_field))
    kernel = kernel_of(cfg, stage) if kernel is None else kernel
    for name, path in stage.defaults:
        if kernel is not None and name not in kwargs and name in inspect.signature(kernel).parameters:
            value = cfg
            for part in path.split("."):
                value = getattr(value, part)
            kwargs[name] = value
    return kwargs


def kernel_of(cfg: Config, stage: Stage):
    """The kernel a stage names (None when the stage is off), refusing a name of another kind."""
    found = info_of(cfg, stage)
    return None if found is None else found.fn


def info_of(cfg: Config, stage: Stage):
    """The registry entry (`KernelInfo`) of the kernel a stage names, or None when the stage is off."""
    name = getattr(cfg, stage.field)
    if name is None:
        return None
    for kind in stage.kinds:
        if name in {k.name for k in kernels.list_kernels(kind)}:
            return kernels.info(kind, name)
    elsewhere = [k.kind for k in kernels.list_kernels() if k.name == name]
    valid = ", ".join(k.name for kind in stage.kinds for k in kernels.list_kernels(kind))
    if elsewhere:
        article = "an" if elsewhere[0][0] in "aeiou" else "a"
        raise ConfigError(f"{stage.field}={name!r} is {article} {elsewhere[0]} kernel, but the {stage.field} stage takes "
                         f"{' or '.join(stage.kinds)} kernels; move it to the stage of its kind or pick one of: {valid}")
    raise ConfigError(f"{stage.field}={name!r} is not a registered {stage.kinds[0]} kernel; valid names: {valid}")


def check_config(cfg: Config) -> None:
    """Each stage names a kernel of its kinds that can run in the loop, and its keyword arguments are the
    kernel's hyper-parameters."""
    if cfg.value_head:
        _check_value_head(cfg)
    for stage in STAGES:
        found = info_of(cfg, stage)
        if found is None:
            if getattr(cfg, stage.kwargs_field):  # arguments of no kernel: a typo'd or forgotten stage name
                raise ConfigError(f"{stage.kwargs_field}={getattr(cfg, stage.kwargs_field)!r} is set but {stage.field} "
                                  f"is None, so nothing would read it; name the kernel ({stage.field}=...) or drop "
                                  f"{stage.kwargs_field}")
            continue
        kernel, name = found.fn, found.name
        if stage.field == "value_tracker" and name not in trackers.TRACKERS:
            raise ConfigError(f"value_tracker={name!r} is not a tracker (state in, state out); valid names: "
                             f"{', '.join(trackers.TRACKERS)}")
        if found.loop:
            raise ConfigError(f"{stage.field}={name!r} cannot run in jaxgrpo's loop: it {found.loop}; pick another "
                             f"{found.kind} kernel (or call it from a custom loop)")
        kwargs = kwargs_of(cfg, stage)
        allowed = inputs_lib.hyperparameters(kernel)
        if stage.passes is not None:
            allowed = [a for a in allowed if a not in stage.passes]
            needs = [p.name for p in inspect.signature(kernel).parameters.values() if p.default is p.empty
                     and p.kind is not p.VAR_KEYWORD and p.name not in stage.passes and p.name not in kwargs]
            if needs:
                raise ConfigError(f"{stage.field}={name!r} reads {', '.join(needs)}, but the {stage.field} stage "
                                 f"passes only {', '.join(stage.passes)}; pick another {found.kind} kernel")
        takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(kernel).parameters.values())
        for key in () if takes_any else kwargs:
            if key not in allowed:
                why = "is passed by the trainer itself" if key in inputs_lib.FIELDS else "is not an argument"
                raise ConfigError(f"{stage.kwargs_field} key {key!r} {why} of {stage.field} {name!r}; "
                                 f"valid keys: {', '.join(allowed) or '(none)'}")
        # Types and declared ranges (`KernelInfo.ranges`): a negative clip epsilon or a std over fewer rows than
        # its ddof is refused here, before anything compiles, not at the first update.
        found.check_kwargs(kwargs, prefix=stage.kwargs_field + ".",
                           context={"group_size": cfg.group_size, "batch_size": cfg.batch_size})
        if stage.field == "group_filter":
            _check_keeps_rows(cfg, found, kwargs)
        if takes_any:
            continue
        missing = [p.name for p in inspect.signature(kernel).parameters.values()
                   if p.name in allowed and p.default is p.empty and p.name not in kwargs]
        # Fields nothing provides, and an environment run's step fields without one: known from the config alone.
        never = [n for n in inputs_lib.fields_read(kernel, kwargs)[0] if inputs_lib.FIELDS[n].available is None
                 or (n in inputs_lib.STEP_FIELDS and cfg.environment is None)]
        if never:
            raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} needs "
                             f"{inputs_lib.unavailable(never[0], cfg, ())}; pick another kernel")
        if missing:
            raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} needs {', '.join(missing)}; set "
                             f"{stage.kwargs_field}={{{', '.join(repr(m) + ': ...' for m in missing)}}}")
    check_group_size(cfg)


def _check_keeps_rows(cfg: Config, found, kwargs: dict) -> None:
    """A group filter returns bool[N], the rows to keep (traced on a batch of the config's shape, not run): a kernel
    of weights would keep every row with a weight that is not 0."""
    import jax

    n, groups = cfg.batch_size, cfg.prompts_per_step
    out = jax.eval_shape(lambda r, g, v: found.fn(r, g, num_groups=groups, valid=v, **kwargs),
                         jax.ShapeDtypeStruct((n,), np.float32), jax.ShapeDtypeStruct((n,), np.int32),
                         jax.ShapeDtypeStruct((n,), np.bool_))
    if getattr(out, "shape", None) != (n,) or out.dtype != np.bool_:
        raise ConfigError(f"group_filter={found.name!r} returns {getattr(out, 'dtype', type(out).__name__)}"
                          f"{list(getattr(out, 'shape', ()))}, not bool[{n}] (the rows to keep); pick a filter such "
                          "as 'dynamic_sampling_filter'")


def _check_value_head(cfg: Config) -> None:
    """An advantage over a value head (GAE, `batch.gae_advantages`) is the whole advantage: the other host stages
    do not run around it, so one set besides its default is refused rather than ignored."""
    others = [name for name in HOST_STAGES if name != "advantage"]
    accepted = {f.name: (f.default,) for f in dataclasses.fields(cfg) if f.name in others}
    ignored = [f"{name}={getattr(cfg, name)!r}" for name in others if getattr(cfg, name) not in accepted[name]]
    ignored += [f"{name}_kwargs={getattr(cfg, name + '_kwargs')!r}" for name in others
                if getattr(cfg, name + "_kwargs")]
    if ignored:
        raise ConfigError(f"advantage={cfg.advantage!r} computes the advantages by GAE over the value head, so "
                          f"{', '.join(ignored)} would not run; drop {'it' if len(ignored) == 1 else 'them'}, or pick "
                          "a group advantage")


def check_group_size(cfg: Config) -> None:
    """Refuses one completion per prompt with a group-relative advantage (`KernelInfo.group_relative`), which
    would give every row an advantage of 0: a run that trains nothing."""
    advantage = info_of(cfg, STAGE["advantage"])
    if cfg.group_size != 1 or advantage is None or not advantage.group_relative:
        return
    alone = [k.name for k in kernels.list_kernels("advantage") if not k.group_relative and k.loop is None]
    raise ValueError(
        f"group_size=1 with advantage={advantage.name!r}: a group-relative advantage compares each completion with "
        "the others of its prompt, so with one completion per prompt it is 0 for every row and nothing trains; set "
        f"group_size >= 2, or pick an advantage that works with one sample ({', '.join(alone)}), or advantage='gae' "
        "(PPO: GAE over a value head)"
    )


def check_fields(cfg: Config, examples) -> None:
    """Every field a configured kernel reads is one the run provides (config and task examples)."""
    for stage in STAGES:
        kernel = kernel_of(cfg, stage)
        if kernel is None or stage.passes is not None:  # stages passing fixed fields: checked by check_config
            continue
        required, _ = inputs_lib.fields_read(kernel, getattr(cfg, stage.kwargs_field))
        if stage.field == "loss":
            required = [n for n in required if n not in ("logp", "old_logp", "advantages", "mask")]
            inside = [n for n in required if n not in LOSS_FIELDS and inputs_lib.FIELDS[n].available is not None]
            if inside:
                raise ConfigError(f"loss {cfg.loss!r} reads {inside[0]}, which the update does not pass a loss "
                                 f"(it passes {', '.join(LOSS_FIELDS)}); pick another loss")
        steps = [n for n in required if n in inputs_lib.STEP_FIELDS]
        if steps and stage.field != "advantage":
            raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} reads {steps[0]}, a field of an episode's "
                             "turns that only the advantage stage passes; pick another kernel")
        for name in required:
            if stage.field in HOST_STAGES and inputs_lib.FIELDS[name].shape == inputs_lib.LOSS:
                if not (stage.field == "token_credit" and name == "advantages"):
                    raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} reads {name}, which exists only "
                                     "inside the update; pick a kernel of another stage")
            why = inputs_lib.unavailable(name, cfg, examples)
            if why:
                raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} needs {why}; pick another kernel "
                                 f"or provide it")


#: The fields only the behaviour policy's recorded log-probs provide (`Trajectories.sampler_logp`).
BEHAVIOUR_FIELDS = ("sampler_logp", "seq_logp")


def check_behaviour_logprobs(cfg: Config, recorded: bool) -> None:
    """Trajectories without the behaviour policy's log-probs (`sampler_logp` None: sampled outside the trainer's
    rollout, which records them) train only when no host stage needs them: a correction stage does."""
    if recorded:
        return
    for stage in STAGES:
        kernel = kernel_of(cfg, stage) if stage.field in HOST_STAGES else None
        if kernel is None:
            continue
        required, _ = inputs_lib.fields_read(kernel, getattr(cfg, stage.kwargs_field))
        needs = [n for n in required if n in BEHAVIOUR_FIELDS]
        if needs:
            raise ConfigError(f"{stage.field} {getattr(cfg, stage.field)!r} reads {needs[0]}, the behaviour policy's "
                              "log-probs, but these trajectories carry none (sampler_logp is None); record each "
                              "token's log-prob where they are sampled (the trainer's rollout does), or drop the stage")


def token_fields_read(cfg: Config) -> set[str]:
    """The token fields the host stages read (gathered from every host only when read)."""
    names = set()
    for stage in STAGES:
        kernel = kernel_of(cfg, stage) if stage.field in HOST_STAGES else None
        if kernel is not None:
            required, optional = inputs_lib.fields_read(kernel, getattr(cfg, stage.kwargs_field))
            names.update(n for n in required + optional if inputs_lib.FIELDS[n].shape == inputs_lib.TOKEN)
    return names


def reads_steps(kernel, kwargs: dict) -> bool:
    """Whether `kernel` reads a field of an environment run's steps (then it runs on the step rows)."""
    required, optional = inputs_lib.fields_read(kernel, kwargs)
    return any(name in inputs_lib.STEP_FIELDS for name in required + optional)


def _first(output, metrics: dict | None = None):
    """A kernel's array; a (array, metrics) kernel's metrics (scalars) go into `metrics` when given."""
    if isinstance(output, tuple):
        if metrics is not None and len(output) > 1 and isinstance(output[1], dict):
            metrics.update({name: float(np.asarray(value)) for name, value in output[1].items()
                            if np.ndim(value) == 0})
        output = output[0]
    return np.asarray(output)


def token_advantages(cfg: Config, batch: inputs_lib.BatchInputs, num_tokens: int,
                     metrics: dict | None = None) -> np.ndarray:
    """The host stages on the whole batch: f32[N, T] advantages (reward shaping, advantage, credit, row weights).
    The kernels' own scalar metrics (e.g. the importance correction's weight statistics) go into `metrics`."""
    kernel = kernel_of(cfg, STAGE["reward_shaping"])
    if kernel is not None:
        shaped = _first(inputs_lib.call(kernel, batch, cfg.reward_shaping_kwargs), metrics).astype(np.float32)
        batch = batch._replace(rewards=np.where(batch.valid, shaped, batch.rewards).astype(np.float32))
    kernel = kernel_of(cfg, STAGE["advantage"])
    if reads_steps(kernel, cfg.advantage_kwargs):  # one advantage per policy turn, for the turn's tokens
        advantages = batch.steps.to_tokens(_first(inputs_lib.call(kernel, batch.of_steps(), cfg.advantage_kwargs)))
    else:
        values = _first(inputs_lib.call(kernel, batch, cfg.advantage_kwargs)).astype(np.float32)
        advantages = values if values.ndim == 2 else np.broadcast_to(values[:, None], (len(values), num_tokens))
    kernel = kernel_of(cfg, STAGE["token_credit"])
    if kernel is not None:
        credit = _first(inputs_lib.call(kernel, batch, cfg.token_credit_kwargs, advantages=advantages), metrics)
        reads_advantages = "advantages" in inspect.signature(kernel).parameters
        advantages = credit if reads_advantages else advantages * credit
    kernel = kernel_of(cfg, STAGE["row_weights"])
    if kernel is not None:
        weights = _first(inputs_lib.call(kernel, batch, cfg.row_weights_kwargs), metrics).astype(np.float32)
        if weights.shape[0] != len(batch.group_ids):  # one weight per group
            weights = weights[batch.group_ids]
        advantages = advantages * weights.reshape(len(weights), *([1] * (advantages.ndim - 1)))
    return np.asarray(advantages, np.float32)
