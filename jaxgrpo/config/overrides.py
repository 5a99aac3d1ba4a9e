"""Setting a config's fields from text: `--set key=value` overrides, and experiment files.

`apply_overrides(cfg, ["optimizer.lr=1e-6", "group_size=8"])` parses each value by its field's annotation;
an unknown key is an error that lists the valid ones. `load_experiment(path)` runs a small Python file and
returns the `Config` its `config()` builds; an error in the file names its line.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import traceback
import types
import typing
from typing import Any

from jaxgrpo.config.fields import REMOVED, Config, replaced
from jaxgrpo.errors import UserError



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
            if (type(node).__name__, part) in REMOVED:
                raise KeyError(f"config key {key!r}: {REMOVED[type(node).__name__, part]}")
            if node is cfg and replaced(part):
                raise KeyError(f"config key {key!r}: {replaced(part)}")
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
