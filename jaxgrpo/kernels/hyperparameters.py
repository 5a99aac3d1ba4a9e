"""The values a kernel's hyper-parameters may take: declared at registration, checked before anything compiles.

Each registered kernel declares, for every numeric hyper-parameter (and the string ones with a fixed set of
values), what it is and the values that mean something::

    @register_loss("ppo_clip", paper="...", ranges={
        "eps_low": (">= 0", "the lower clip epsilon"),
        "eps_high": (">= 0", "the upper clip epsilon; None: eps_low"),
    })

A range is a comparison (``>= 0``, ``> 0``, ``< 1``, ``<= 1``), an interval (``in [0, 1]``, ``in (0, 1]``),
``any`` (every finite number), or, for a string, ``one of a, b``. A bound may name another hyper-parameter of
the same kernel (``>= lower_start``) or a batch size of the run (``group_size``, ``batch_size``, given by
the config check); a bound that is unknown (called without a config) or None (a parameter left to its
default of None) is not checked. The type comes from the parameter's annotation, or its default: ``float``
takes any finite real number, ``int`` an integer (no bool), ``X | None`` None too.

`check` is what `jaxgrpo.config.validate` runs on each stage's keyword arguments, so a negative clip
epsilon, a group std with ``std_ddof >= group_size`` or ``eps_high="abc"`` is a one-line error before the
model is built, not a NaN or a traceback at the first update.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import re
from typing import Any, Callable, Mapping

from jaxgrpo.errors import ConfigError

#: Names a bound may take from the run's config (`context`), besides the kernel's own hyper-parameters.
CONFIG_BOUNDS = ("group_size", "batch_size")

_TYPES = {"float": float, "int": int, "bool": bool, "str": str, "None": type(None)}
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf)"
_BOUND = rf"(?:{_NUMBER}|[A-Za-z_][A-Za-z_0-9]*)"


def _bound(text: str) -> float | str:
    text = text.strip()
    return float(text) if re.fullmatch(_NUMBER, text) else text


@dataclasses.dataclass(frozen=True)
class Range:
    """The values one hyper-parameter may take, and what it is (for the error message).

    `low` and `high` are numbers, names of other values (a hyper-parameter, `group_size`) or None
    (unbounded); `choices` lists a string parameter's values instead.
    """

    spec: str
    what: str
    low: float | str | None = None
    high: float | str | None = None
    low_closed: bool = True
    high_closed: bool = True
    choices: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str, what: str) -> "Range":
        """A `Range` from its text (see the module docstring); a spec it cannot read is a ValueError."""
        text = " ".join(spec.split())
        if not what:
            raise ValueError(f"range {spec!r} needs a description of the parameter (what it is)")
        if text == "any":
            return cls(text, what)
        if text.startswith("one of "):
            return cls(text, what, choices=tuple(c.strip() for c in text[len("one of "):].split(",")))
        match = re.fullmatch(rf"(>=|>|<=|<) ({_BOUND})", text)
        if match:
            op, value = match.group(1), _bound(match.group(2))
            if op.startswith(">"):
                return cls(text, what, low=value, low_closed=op == ">=")
            return cls(text, what, high=value, high_closed=op == "<=")
        match = re.fullmatch(rf"in ([\[(])({_BOUND}), ({_BOUND})([\])])", text)
        if match:
            return cls(text, what, low=_bound(match.group(2)), high=_bound(match.group(3)),
                       low_closed=match.group(1) == "[", high_closed=match.group(4) == "]")
        raise ValueError(f"cannot read the range {spec!r}; write e.g. '>= 0', '> 0', 'in [0, 1]', 'in (0, 1]', "
                         "'in [0, group_size)', 'any' or 'one of a, b'")

    def names(self) -> list[str]:
        """The named bounds (other hyper-parameters, config values) this range refers to."""
        return [b for b in (self.low, self.high) if isinstance(b, str)]

    def violation(self, value: Any, context: Mapping[str, Any]) -> str | None:
        """None when `value` lies in the range; else what it must be, bounds by name shown with their value."""
        if self.choices:
            return None if value in self.choices else f"one of {', '.join(map(repr, self.choices))}"
        low, high = (context.get(b) if isinstance(b, str) else b for b in (self.low, self.high))
        ok = ((low is None or (value >= low if self.low_closed else value > low))
              and (high is None or (value <= high if self.high_closed else value < high)))
        if ok:
            return None
        shown = self.spec
        for name in self.names():
            if context.get(name) is not None:
                shown = re.sub(rf"\b{name}\b", f"{name}={context[name]}", shown)
        return shown


def declared_type(parameter: inspect.Parameter) -> tuple[type, ...] | None:
    """The types a hyper-parameter takes, from its annotation (a string under postponed annotations) or its
    default; None when neither says (an array-valued argument, e.g. a PRNG key)."""
    annotation = parameter.annotation
    if isinstance(annotation, str) and annotation:
        parts = [p.strip() for p in annotation.split("|")]
        if all(p in _TYPES for p in parts):
            return tuple(_TYPES[p] for p in parts)
        return None
    if isinstance(annotation, type) and annotation is not inspect.Parameter.empty:
        return (annotation,) if annotation in _TYPES.values() else None
    default = parameter.default
    if default is inspect.Parameter.empty or default is None:
        return None
    return (type(default),) if type(default) in _TYPES.values() else None


def is_numeric(types: tuple[type, ...] | None) -> bool:
    """Whether a parameter of these types is a number (int or float, optionally None)."""
    return bool(types) and any(t in (int, float) for t in types)


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    for t in types:
        if t is type(None) and value is None:
            return True
        if t is float and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            return True
        if t is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return True
        if t in (bool, str) and isinstance(value, t):
            return True
    return False


def _type_names(types: tuple[type, ...]) -> str:
    names = {float: "a finite number", int: "an integer", bool: "true or false", str: "a string", type(None): "None"}
    return " or ".join(names[t] for t in types)


def parse_ranges(fn: Callable, name: str, ranges: Mapping[str, Any] | None) -> dict[str, Range]:
    """The `ranges=` of a registration as `Range`s, each naming a parameter of `fn`; raises ValueError otherwise."""
    parameters = inspect.signature(fn).parameters
    parsed = {}
    for key, spec in (ranges or {}).items():
        if key not in parameters:
            raise ValueError(f"kernel {name!r}: ranges names {key!r}, which is not a parameter of "
                             f"{getattr(fn, '__name__', fn)}")
        if isinstance(spec, Range):
            parsed[key] = spec
        elif isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, str) for s in spec):
            parsed[key] = Range.parse(*spec)
        else:
            raise ValueError(f"kernel {name!r}: ranges[{key!r}] must be (spec, what), e.g. ('>= 0', 'the lower "
                             f"clip epsilon'), or a Range, got {spec!r}")
    return parsed


def check(fn: Callable, name: str, ranges: Mapping[str, Range], kwargs: Mapping[str, Any], *, prefix: str = "",
          context: Mapping[str, Any] | None = None) -> None:
    """Raises `ConfigError` (a ValueError, one line) for the first of `kwargs` of the wrong type or out of its
    declared range.

    Args:
      fn, name: the kernel and its registry name.
      ranges: its declared ranges (`KernelInfo.ranges`).
      kwargs: the keyword arguments the experiment gives it (names already checked against the signature).
      prefix: how the config calls them, e.g. "loss_kwargs.".
      context: values named bounds may refer to besides the kernel's parameters (`CONFIG_BOUNDS`).
    """
    parameters = inspect.signature(fn).parameters
    values = {p.name: p.default for p in parameters.values() if p.default is not p.empty}
    values.update(kwargs)
    values.update(context or {})
    for key, value in kwargs.items():
        if key not in parameters:
            continue
        declared = ranges.get(key)
        what = f" ({declared.what})" if declared else ""
        types = declared_type(parameters[key])
        if types is not None and not _fits(value, types):
            raise ConfigError(f"{prefix}{key}={value!r} has the wrong type for {name}: must be {_type_names(types)}"
                             f"{what}, got {type(value).__name__}")
        if declared is None or value is None:
            continue
        if not declared.choices and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            continue  # an array-valued argument (no declared type): nothing to compare
        must = declared.violation(value, values)
        if must is not None:
            raise ConfigError(f"{prefix}{key}={value!r} is out of range for {name}: must be {must}{what}")
