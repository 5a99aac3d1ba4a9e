"""What an environment is: its messages, a turn's `Step`, the `Environment` protocol (the package docstring says
how they are used). The built-in environments import these from here, below the registry that names them."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

Message = dict  # {"role": str, "content": str}


class Step(NamedTuple):
    """What an environment returns for one policy turn."""

    observation: list[Message] | None
    reward: float
    done: bool
    info: dict = {}


@runtime_checkable
class Environment(Protocol):
    """An episode's other side (see `jaxgrpo.envs`)."""

    failure_reward: float

    def reset(self, example: Any) -> list[Message]:
        ...

    def step(self, action: str) -> Step:
        ...
