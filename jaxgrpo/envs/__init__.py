"""Environments for multi-turn rollouts: what answers a policy's turn, registered by name like tasks.

An environment runs on the host. `reset(example)` opens an episode and returns its first messages (chat
messages: `{"role": ..., "content": ...}`, rendered with the model's chat template); then for every policy turn
`step(action)` (the turn's text, its stop token removed) returns a `Step`: the observation that answers it
(messages, e.g. a tool's output or the next user turn; None when the episode is over), the reward of that turn,
whether the episode is done, and free-form `info`.

    env = make_environment("calculator")
    messages = env.reset({"question": "What is 123 * 456?", "answer": "56088"})
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>')
    step.observation  # [{"role": "tool", "content": "56088"}]

`jaxgrpo.engine.multi_turn.rollout` runs groups of episodes through the rollout engine in token space. An
environment's `failure_reward` is what a trajectory gets when its environment raises or times out (the episode
ends there, with an error observation, and the rollout counts it). An environment may define `state()`: the
state its next turn acts from, hashable (step-level credit such as GiGPO groups the turns of a prompt's episodes
that act from the same state); without it, a turn's state is the observations of its episode so far. Its
`observation_roles` (("user",) when absent) are the roles its observations take: a run checks that the model's
chat template renders them before anything is compiled. Its optional `demonstration(example)` is the policy turns
of a correct episode (a list of strings): the supervised warm-up (`warmup_sft_steps`) plays them against the
environment and trains on them, the observations in between attended to but not trained on.

Built in: "calculator" (`jaxgrpo.envs.tools.ToolEnvironment` with the calculator tool: the final answer is
checked against the example's), "tools" (the calculator and the sandboxed Python tool, `jaxgrpo.envs.sandbox`)
and "guess_number" (`jaxgrpo.envs.games.GuessNumber`: a number game with
higher/lower feedback).
"""

from __future__ import annotations

from typing import Callable

from jaxgrpo.envs import games, sandbox, tools
from jaxgrpo.envs.base import Environment, Message, Step

_ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str, factory: Callable[..., Environment]) -> None:
    """Registers `factory(**kwargs) -> Environment` under `name` (a new name; re-registering raises)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an environment's name must be a non-empty string, got {name!r}")
    if name in _ENVIRONMENTS:
        raise ValueError(f"an environment named {name!r} is registered already; choose another name")
    _ENVIRONMENTS[name] = factory


def environment_names() -> list[str]:
    return sorted(_ENVIRONMENTS)


def make_environment(name: str, **kwargs) -> Environment:
    """A new environment of the registered `name`; a one-line error naming the registered ones otherwise."""
    if name not in _ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(environment_names())} "
                         f"(register one with jaxgrpo.envs.register_environment)")
    return _ENVIRONMENTS[name](**kwargs)


register_environment("calculator", tools.calculator_environment)
register_environment("tools", lambda **kwargs: tools.ToolEnvironment([tools.CALCULATOR, sandbox.PYTHON], **kwargs))
register_environment("guess_number", games.GuessNumber)

__all__ = ["Environment", "Message", "Step", "environment_names", "make_environment", "register_environment"]
