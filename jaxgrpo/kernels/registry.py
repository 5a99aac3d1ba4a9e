"""A registry of kernels by name, so experiments and notebooks pick them with a string.

Every kernel is registered under a kind and a lowercase name, with the paper it
comes from. Users add their own without touching the library::

    @jaxgrpo.register_advantage("my_estimator", paper="My paper (2026)")
    def my_estimator(rewards, group_ids, *, num_groups, valid=None):
        ...

    jaxgrpo.get_advantage("my_estimator")
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from jaxgrpo.kernels import hyperparameters
from jaxgrpo.kernels.hyperparameters import Range

#: The kinds of kernel, with the contract each follows.
KINDS: dict[str, str] = {
    "advantage": (
        "outcome advantage estimator: fn(rewards f32[N], group_ids i32[N], *, num_groups, "
        "valid=None, **hparams) -> f32[N]"
    ),
    "loss": (
        "policy loss: fn(logp f32[N,T], old_logp f32[N,T], advantages f32[N]|f32[N,T], "
        "mask f32[N,T], **hparams) -> (per_token_loss f32[N,T], metrics dict)"
    ),
    "token_advantage": "token-level advantage or return: arrays [N,T] in, [N,T] out",
    "credit": "token or segment credit assignment: weights or advantages per token",
    "reward": "reward shaping: raw rewards or outcomes in, shaped rewards out",
    "selection": "prompt or group selection and rollout allocation: masks, weights or counts",
    "kl": "KL estimator between two per-token log-probabilities",
    "mask": "a loss mask derived from rewards, groups or the policy's statistics (e.g. pivot exclusion, off-policy sequences)",
}


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """One registered kernel: its name, kind, paper and the function itself."""

    name: str
    kind: str
    paper: str
    fn: Callable
    experimental: bool = False
    #: Why the kernel cannot run in jaxgrpo's training loop (an input the loop has no way to produce), or
    #: None for a kernel an experiment can select. Declared at registration, shown in docs/methods.md.
    loop: str | None = None
    #: The values each numeric (or fixed-choice string) hyper-parameter may take, with what it is
    #: (`jaxgrpo.kernels.hyperparameters`); checked by `jaxgrpo.config.validate` before anything compiles.
    ranges: Mapping[str, Range] = dataclasses.field(default_factory=dict)
    #: An advantage that compares each completion with the others of its prompt's group: with one completion
    #: per prompt (group_size=1) it is 0 for every row, so `validate` refuses that pairing. Declared at
    #: registration (tests/kernels/test_kernels_group_relative.py checks each declaration against the kernel).
    group_relative: bool = False

    def check_kwargs(self, kwargs: Mapping[str, Any], *, prefix: str = "", context: Mapping[str, Any] | None = None):
        """Raises ValueError (one line) for a keyword argument of the wrong type or outside its declared range."""
        hyperparameters.check(self.fn, self.name, self.ranges, kwargs, prefix=prefix, context=context)

    @property
    def summary(self) -> str:
        """The first line of the kernel's docstring."""
        doc = inspect.getdoc(self.fn) or ""
        return doc.splitlines()[0] if doc else ""


_REGISTRY: dict[str, dict[str, KernelInfo]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, *, paper: str, experimental: bool = False, loop: str | None = None,
             ranges: Mapping[str, Any] | None = None, group_relative: bool = False, overwrite: bool = False):
    """Decorator registering `fn` as a kernel of `kind` under `name`.

    Args:
      kind: one of `KINDS`.
      name: lowercase registry name; `experimental/...` names mark reconstructions
        whose formula could not be checked against the authors' code.
      paper: title and year of the paper the kernel implements.
      experimental: whether the formula is a documented reconstruction.
      loop: why the kernel cannot run in jaxgrpo's training loop, e.g. "needs a multi-turn environment"
        (what it reads that the loop cannot produce); None (the default) for a kernel an experiment can
        select, which tests/train/test_train_every_kernel.py then runs for two steps.
      ranges: for each numeric hyper-parameter (and string one with fixed values), (range, what it is),
        e.g. {"eps_low": (">= 0", "the lower clip epsilon")} (see `jaxgrpo.kernels.hyperparameters`).
        Every built-in kernel declares one for each numeric hyper-parameter (tests/config/test_config.py checks).
      group_relative: an advantage whose value for a row compares it with the other rows of its group
        (GRPO, RLOO, ...): zero for every row of a group of one, so it cannot train with group_size=1.
      overwrite: allow replacing an existing entry (handy when re-running a
        notebook cell); otherwise a duplicate name is an error.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; valid kinds: {sorted(KINDS)}")
    if not name or name != name.lower() or " " in name:
        raise ValueError(f"kernel name must be lowercase without spaces, got {name!r}")
    if not paper:
        raise ValueError(f"kernel {name!r} needs a paper (title and year)")
    if loop is not None and not loop.startswith("needs "):
        raise ValueError(f"kernel {name!r}: loop= says what the kernel needs that the loop lacks and starts with "
                         f"'needs ', got {loop!r}")

    def decorator(fn: Callable) -> Callable:
        if name in _REGISTRY[kind] and not overwrite and _REGISTRY[kind][name].fn is not fn:
            raise ValueError(
                f"a {kind} kernel named {name!r} is already registered; pass overwrite=True to replace it"
            )
        _REGISTRY[kind][name] = KernelInfo(
            name=name, kind=kind, paper=paper, fn=fn, experimental=experimental or name.startswith("experimental/"),
            loop=loop, ranges=hyperparameters.parse_ranges(fn, name, ranges), group_relative=group_relative,
        )
        return fn

    return decorator


def register_advantage(name: str, *, paper: str = "user-defined", **kwargs):
    """Decorator registering an outcome advantage estimator (see `KINDS['advantage']`)."""
    return register("advantage", name, paper=paper, **kwargs)


def register_loss(name: str, *, paper: str = "user-defined", **kwargs):
    """Decorator registering a policy loss (see `KINDS['loss']`)."""
    return register("loss", name, paper=paper, **kwargs)


def get(kind: str, name: str) -> Callable:
    """The kernel of `kind` registered under `name`; the error lists the valid names."""
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; valid kinds: {sorted(KINDS)}")
    try:
        return _REGISTRY[kind][name].fn
    except KeyError:
        valid = ", ".join(sorted(_REGISTRY[kind])) or "(none registered)"
        raise KeyError(f"no {kind} kernel named {name!r}; valid names: {valid}") from None


def get_advantage(name: str) -> Callable:
    """The outcome advantage estimator registered under `name`."""
    return get("advantage", name)


def get_loss(name: str) -> Callable:
    """The policy loss registered under `name`."""
    return get("loss", name)


def info(kind: str, name: str) -> KernelInfo:
    """The registry entry (name, kind, paper, function) of one kernel."""
    get(kind, name)  # validates, with the error listing valid names
    return _REGISTRY[kind][name]


def list_kernels(kind: str | None = None) -> list[KernelInfo]:
    """Every registered kernel (optionally of one kind), sorted by kind then name."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; valid kinds: {sorted(KINDS)}")
    kinds = [kind] if kind else list(KINDS)
    return [_REGISTRY[k][n] for k in kinds for n in sorted(_REGISTRY[k])]
