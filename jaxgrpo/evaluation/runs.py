"""Reading a finished (or running) run directory back: its config, its checkpoints, its trained policy.

`jaxgrpo-eval` and `jaxgrpo-export` start here. A run directory holds `config.json` (the resolved
`Config`) and `checkpoints/<step>/` (orbax: the trainer's checkpoint state and JSON metadata). The
policy is rebuilt the way the trainer built it (`Trainer(cfg)`) and its parameters are replaced by a
checkpoint's, read without writing anything into the run directory (a run may still be writing it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any

from jaxgrpo.config import Config, migrate, optional_section
from jaxgrpo.errors import UserError

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"


class RunReadError(UserError, ValueError):
    """A run directory cannot be read back; the message (one line) names what is missing and what to do."""


def config_from_dict(values: dict, cfg: Any = None) -> Config:
    """The `Config` that `to_dict` wrote as `values` (config.json); keys it does not know are an error."""
    if cfg is None:  # the top level: fields that became stages since the run was written read as those stages
        cfg, values = Config(), migrate(values)
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for name, value in values.items():
        if name not in fields:
            raise RunReadError(f"config.json has a field {name!r} that this version of jaxgrpo does not know; "
                               "read it with the jaxgrpo version that wrote it")
        current = getattr(cfg, name)
        section = optional_section(cfg, name)
        if section is not None:  # an optional section (Config.lora): None, or its fields
            if value is not None and not isinstance(value, dict):
                raise RunReadError(f"config.json's {name!r} is {value!r}, neither null nor a section of fields; "
                                   "restore the run's config.json")
            setattr(cfg, name, None if value is None else config_from_dict(value, current or section()))
            continue
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise RunReadError(f"config.json's {name!r} is {value!r}, not a section of fields; restore the "
                                   "run's config.json")
            config_from_dict(value, current)
        else:
            hint = typing.get_type_hints(type(cfg))[name]
            if hint is float and isinstance(value, int):
                value = float(value)
            elif (hint is tuple or typing.get_origin(hint) is tuple) and isinstance(value, list):
                value = tuple(value)  # JSON has no tuples: e.g. LoraConfig.targets comes back a list
            setattr(cfg, name, value)
    return cfg


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG_FILE))


def read_config(run_dir: str) -> Config:
    """The config a run directory was trained with."""
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isdir(run_dir):
        raise RunReadError(f"run directory {run_dir} does not exist")
    if not os.path.isfile(path):
        raise RunReadError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE} (train into it with jaxgrpo-train first)")
    try:
        with open(path) as f:
            values = json.load(f)
    except ValueError as error:  # not JSON (json.JSONDecodeError), or not text
        raise RunReadError(f"{path} is not a valid config.json ({' '.join(str(error).split())}); restore it, "
                           "e.g. from the run's logs, or train again") from None
    if not isinstance(values, dict):
        raise RunReadError(f"{path} holds {type(values).__name__}, not a config object; restore the run's config.json")
    return config_from_dict(values)


def checkpoint_steps(run_dir: str) -> list[int]:
    """The steps of the complete checkpoints of a run directory, ascending (orbax's temporary ones left out)."""
    directory = os.path.join(run_dir, CHECKPOINTS)
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and os.path.isdir(os.path.join(directory, name)))


def choose_step(run_dir: str, step: int | None) -> int:
    """`step`, or the newest checkpoint's, after checking that it exists."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise RunReadError(f"run directory {run_dir} has no checkpoints in {os.path.join(run_dir, CHECKPOINTS)}; "
                           "train with checkpoint_every > 0, or pass a model name or directory instead")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise RunReadError(f"run directory {run_dir} has no checkpoint of step {step}; its checkpoints are of "
                           f"steps {', '.join(map(str, steps))}")
    return step


def restore_trainer(run_dir: str, step: int, trainer):
    """Sets `trainer.loop_state` to `run_dir`'s checkpoint of `step` (read-only); returns its metadata.

    The checkpoint's arrays are verified against their checksums (`Checkpointer.restore`): a damaged one is a
    `RunReadError` naming the step and the array, never a policy of flipped bits.
    """
    from jaxgrpo.run.checkpoint import CheckpointDamaged, Checkpointer
    from jaxgrpo.train.state import checkpoint_tree, loop_state_of

    directory = os.path.abspath(os.path.join(run_dir, CHECKPOINTS))
    others = ", ".join(str(s) for s in checkpoint_steps(run_dir) if s != step) or "none"
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        like = trainer.loop_state
        state, meta = checkpointer.restore(step, checkpoint_tree(like))
    except CheckpointDamaged as error:
        raise RunReadError(f"{error}; pass --step with another of its checkpoints (steps: {others})") from error
    except Exception as error:  # orbax and tensorstore raise many kinds for an unreadable checkpoint
        first = (str(error).strip().splitlines() or [""])[0]
        raise RunReadError(f"checkpoint of step {step} in {directory} does not restore ({type(error).__name__}: "
                           f"{first}); pass --step with another of its steps") from error
    finally:
        checkpointer.close()
    trainer.loop_state = loop_state_of(state, meta, like)
    return dict(meta)


def build_trainer(cfg: Config, run_dir: str | None = None, step: int | None = None):
    """A `Trainer` for `cfg` whose policy is the checkpoint of `step` in `run_dir` (None: the config's model as
    built, untrained); returns (trainer, step or None)."""
    from jaxgrpo.train.loop import Trainer

    trainer = Trainer(cfg)
    if run_dir is not None:
        restore_trainer(run_dir, step, trainer)
    return trainer, step
