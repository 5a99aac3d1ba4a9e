"""What a config names, checked before anything heavy is built: the task, the rewards, the model, the budgets.

`jaxgrpo.config.validate` checks the config's values on their own. `check` goes one step further, still
without building a model or reading a data set: the task exists and takes the config's keyword arguments,
the reward names resolve and include the correctness reward, the model resolves (a registered builder, or
a checkpoint whose config file is read, not its weights), the prompt and completion budgets fit the
model's context window, and the mesh fits the devices. Each mistake is a one-line `ConfigError` naming the
config field and the fix. `Trainer.__init__` runs it first (`check_trainer`: it, then the data and the fields
the stages' kernels read), and the console scripts before anything else, so a misspelt name fails in a second,
not after a model build, a warm-up and a first sampling.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from jaxgrpo.config import Config, resolve_packing, validate
from jaxgrpo.config.validation import check_micro_batch_split
from jaxgrpo.distributed import batch_shards
from jaxgrpo.errors import ConfigError


def task_of(cfg: Config):
    """The task `cfg.task` names, built with its keyword arguments (no data is read)."""
    from jaxgrpo import data
    import jaxgrpo.data.toy  # noqa: F401  (registers the offline toy_sum task)

    try:
        task = data.get_task(cfg.task.name, **cfg.task.kwargs)
        task.name  # noqa: B018  (a task checks its options when it names itself, e.g. arithmetic's difficulty)
        return task
    except TypeError as error:  # a keyword argument the task does not take
        raise ConfigError(f"task.kwargs={cfg.task.kwargs!r} do not fit task {cfg.task.name!r}: "
                          f"{' '.join(str(error).split())}; set only the task's options") from None
    except ValueError as error:  # an unknown name or config (the message lists the valid ones)
        raise ConfigError(f"task.name={cfg.task.name!r}: {' '.join(str(error).split())}") from None


def reward_fns_of(cfg: Config, task) -> list:
    """[(reward_fn, weight)] of `cfg.rewards` (or the task's defaults); the correctness reward among them."""
    from jaxgrpo.train import rollout

    for name, weight in cfg.rewards.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"rewards[{name!r}]={weight!r} must be a finite number (the reward's weight)")
    try:
        return rollout.resolve_rewards(cfg, task)
    except KeyError as error:
        raise ConfigError(error.args[0]) from None


def check_correctness_reward(cfg: Config, reward_fns) -> None:
    """`cfg.correctness_reward` is one of the rewards (it decides accuracy and dynamic sampling)."""
    from jaxgrpo.rewards import combine

    names = [combine.reward_name(fn) for fn, _ in reward_fns]
    if cfg.correctness_reward not in names:
        raise ConfigError(f"correctness_reward={cfg.correctness_reward!r} is not among the rewards {names}; set it "
                          "to the reward that decides correctness, or add it to rewards")


def model_config_of(cfg: Config):
    """The architecture of `cfg.model` read from its config file, without its weights; None for a model a
    registered builder makes in code (known once built)."""
    from jaxgrpo.train.state import MODEL_BUILDERS

    if cfg.model in MODEL_BUILDERS:
        return None
    from jaxgrpo.models import UnsupportedConfigError, WeightFileError, load_config

    try:
        return load_config(cfg.model)
    except (KeyError, FileNotFoundError, WeightFileError, UnsupportedConfigError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise ConfigError(f"model={cfg.model!r}: {' '.join(str(message).split())}") from None


def check_budget(cfg: Config, model_config: Any) -> None:
    """The longest prompt the config allows plus the completion budget fit the model's context window.

    Positions beyond the window have no meaning for the model (RoPE was trained up to it): rows that run
    past it would train on garbage without a word. The sampler checks each real prompt too.
    """
    window = getattr(model_config, "max_position_embeddings", None)
    s = cfg.sampling
    if window and s.max_prompt_len + s.max_new_tokens > window:
        fit = window - s.max_prompt_len
        fix = (f"lower sampling.max_new_tokens to at most {fit} or sampling.max_prompt_len" if fit >= 1 else
               f"lower sampling.max_prompt_len below {window}")
        raise ConfigError(
            f"sampling.max_prompt_len={s.max_prompt_len} + sampling.max_new_tokens={s.max_new_tokens} = "
            f"{s.max_prompt_len + s.max_new_tokens} positions exceed the context window of model {cfg.model!r} "
            f"({window} positions); {fix}")


def check_rollout_split(cfg: Config, num_devices: int, devices: str | None = None) -> None:
    """`mesh.rollout_devices` leaves the learner some of the `num_devices` (named `devices`, e.g. a topology's
    chips)."""
    rollout = cfg.mesh.rollout_devices
    if rollout and rollout >= num_devices:
        raise ConfigError(f"mesh.rollout_devices={rollout} leaves the learner none of "
                          f"{devices or f'the {num_devices} device(s)'}; give the sampler fewer (at most "
                          f"{num_devices - 1})")


def check_mesh(cfg: Config, num_devices: int, num_processes: int = 1, mesh=None) -> None:
    """The mesh shape fits `num_devices` (less `mesh.rollout_devices`, an equal share of each process's), a
    micro-batch's rows split over its data x fsdp shards (those of `mesh` where one is given), and every process
    reads whole prompt groups."""
    check_rollout_split(cfg, num_devices)
    rollout = cfg.mesh.rollout_devices
    if rollout and rollout % num_processes:
        raise ConfigError(f"mesh.rollout_devices={rollout} does not split evenly over the {num_processes} processes, "
                          f"each of which samples on devices of its own; make it a multiple of {num_processes}")
    num_devices -= rollout
    shape = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model]
    fixed = math.prod(s for s in shape if s != -1)
    if num_devices % fixed or (-1 not in shape and fixed != num_devices):
        raise ConfigError(
            f"mesh (data, fsdp, model) = ({', '.join(map(str, shape))}) does not fit the {num_devices} device(s) "
            f"here: the sizes' product must be {num_devices}, or divide it with one axis -1 taking the rest; "
            f"e.g. mesh.data=-1 mesh.fsdp=1 mesh.model=1")
    if mesh is not None:  # a mesh given: its shape, whatever cfg.mesh says
        check_micro_batch_split(cfg, batch_shards(mesh))
    elif -1 not in shape[:2]:
        check_micro_batch_split(cfg, shape[0] * shape[1])
    else:  # -1 in data or fsdp takes the devices mesh.model leaves
        check_micro_batch_split(cfg, num_devices // shape[2])
    if cfg.prompts_per_step % num_processes:
        raise ConfigError(f"prompts_per_step={cfg.prompts_per_step} is not divisible by the {num_processes} "
                          "processes; each host reads an equal block of whole prompt groups")


def load_split(cfg: Config, task, split: str, num_examples: int | None = None):
    """The examples of a task's split; a ValueError of the task (no such split, options it refuses, a
    data_dir it does not read) becomes a `ConfigError` naming the task and split."""
    from jaxgrpo.errors import UserError

    try:
        return task.load(split, data_dir=cfg.task.data_dir,
                         **({} if num_examples is None else {"num_examples": num_examples}))
    except ValueError as error:
        if isinstance(error, UserError):
            raise
        raise ConfigError(f"task {cfg.task.name!r}, split {split!r}: {' '.join(str(error).split())}") from error


def check(cfg: Config, *, task=None, reward_fns=None, model_config=None, num_devices: int | None = None,
          num_processes: int = 1, mesh=None):
    """Every check above that what is given allows; returns (task, reward_fns, model_config).

    `task`, `reward_fns` and `model_config` are taken as given when passed (a trainer built with its own
    model or task); `num_devices` None skips the mesh check; `mesh`: the one the trainer was given, if any.
    """
    task = task_of(cfg) if task is None else task
    reward_fns = reward_fns_of(cfg, task) if reward_fns is None else reward_fns
    if cfg.environment is None:  # an environment's episodes are rewarded by it, correct when positive
        check_correctness_reward(cfg, reward_fns)
    model_config = model_config_of(cfg) if model_config is None else model_config
    if model_config is not None:
        check_budget(cfg, model_config)
    if num_devices is not None:
        check_mesh(cfg, num_devices, num_processes, mesh)
    return task, reward_fns, model_config


def check_trainer(cfg: Config, model, task, reward_fns, mesh):
    """What a `Trainer` is given, checked before anything is built: the config (its packing settled for the
    platform), what it names (task, rewards, model, context budget, mesh), then the data and the fields the
    stages' kernels read. Returns (cfg, task, reward_fns, train examples, held-out examples)."""
    from jaxgrpo.models.attention import target_platform as attention_platform
    from jaxgrpo.train import guidance, stages

    # packing=None: the platform's measured default, settled before anything reads it (and by `cfg`'s setter).
    cfg = resolve_packing(cfg, attention_platform(mesh))
    validate(cfg)  # every value, kernel name and kernel argument, before anything is built
    if cfg.mesh.rollout_devices and mesh is not None:
        raise ConfigError(f"mesh.rollout_devices={cfg.mesh.rollout_devices} splits the devices itself; pass no "
                          "mesh, or set mesh.rollout_devices=0 and sample on the mesh given")
    if jax.process_count() > 1:
        _check_multi_process(cfg)
    task, reward_fns, _ = check(
        cfg, task=task, reward_fns=reward_fns or None, model_config=None if model is None else model.config,
        num_devices=jax.device_count() if mesh is None else mesh.size, num_processes=jax.process_count(), mesh=mesh)
    train_examples = load_split(cfg, task, cfg.task.train_split)
    stages.check_fields(cfg, train_examples)  # every field a stage's kernel reads, before the model is built
    if cfg.guidance is not None:
        guidance.check(task, train_examples, jax.process_count())
    eval_examples = (load_split(cfg, task, cfg.task.eval_split, cfg.task.num_eval_examples)
                     if cfg.task.num_eval_examples else [])
    return cfg, task, reward_fns, train_examples, eval_examples


def _check_multi_process(cfg: Config) -> None:
    """What a multi-process run cannot combine, in one line each."""
    if cfg.partial_rollout_tokens:
        raise ConfigError("partial_rollout_tokens runs in one process for now (its carried groups are not split by "
                          "process); set partial_rollout_tokens=0 for a multi-process run")
    if cfg.max_staleness and not cfg.mesh.rollout_devices:
        raise ConfigError(f"max_staleness={cfg.max_staleness} in a multi-process run samples on devices of each "
                          f"process's own; set mesh.rollout_devices to a multiple of the {jax.process_count()} "
                          f"processes (e.g. {jax.process_count()})")
    if cfg.max_staleness and cfg.group_filter is not None:  # the rounds of a group filter are agreed across processes
        raise ConfigError("group_filter agrees its sampling rounds across processes, which one-step-off's sampling "
                          "thread does not do in a multi-process run; set max_staleness=0, or group_filter=None")


def samples_locally() -> bool:
    """Whether each process samples its own prompts on devices of its own, with nothing exchanged between processes
    while it samples: in every multi-process run (each process's rollout engine admits its own requests, on its
    own devices; one-step-off's sampling thread could not issue collectives anyway, as two threads issuing them in
    an order that differs between processes would deadlock)."""
    return jax.process_count() > 1


def environment_turns(cfg: Config, tokenizer, examples):
    """`multi_turn.ChatTurns` of the tokenizer, checked on the environment's opening of the first example and
    on its observations' roles: a `ConfigError` naming the environment and the model otherwise."""
    from jaxgrpo import envs
    from jaxgrpo.engine import multi_turn

    e = cfg.environment
    env = envs.make_environment(e.name, **e.kwargs)
    try:
        turns = multi_turn.ChatTurns(tokenizer)
        turns.check(env, examples[0])
    except (ValueError, TypeError) as error:
        raise ConfigError(f"environment {e.name!r} with model {cfg.model!r}: {error}; pick a model whose chat "
                          "template renders it, or an environment answering in roles it has") from None
    if cfg.warmup_sft_steps:  # the warm-up trains on demonstrated episodes
        demonstrate = getattr(env, "demonstration", None)
        if not callable(demonstrate) or demonstrate(examples[0]) is None:
            raise ConfigError(f"warmup_sft_steps={cfg.warmup_sft_steps} trains on demonstrated episodes, but "
                              f"environment {e.name!r} has no demonstration(example); set warmup_sft_steps=0 or "
                              "give the environment one")
    return turns
