"""Multi-turn rollouts in token space: groups of environment episodes through the engine's session API.

    turns = ChatTurns(tokenizer)
    trajectories, stats = rollout(engine, turns, lambda: make_environment("calculator"), examples,
                                  group_size=4, max_turns=4, turn_tokens=96, sampling=SamplingParams(1.0))

Every episode of an example (its G trajectories, `group_size`) opens with the environment's first messages,
rendered by the chat template and encoded once. Each policy turn is sampled by the engine until its stop token
(or the turn's token budget); its text goes to the environment's `step`; the observation that answers it is
rendered as the template would continue the conversation and **encoded alone** (`ChatTurns.observation`), then
appended to the live sequence with `Engine.extend`, which continues from its cache. The history is never
decoded and encoded again, so a trajectory's tokens are exactly those sampled and appended: the log-probs a
trainer computes over them are the behaviour log-probs the engine recorded (re-tokenizing a decoded history
can merge or split tokens, and the two then disagree).

An episode ends when the environment says so, after `max_turns` policy turns, when the engine's context has
no room for the next observation and turn, or when the environment raises or overruns `step_timeout` seconds
(then it ends with the environment's `failure_reward`, and `stats` counts it). Each `Trajectory` carries the
tokens after its prompt with a loss mask (True on the policy's tokens only), the behaviour and policy log-probs,
the policy version of each sampled token, the turn each token belongs to, the rewards per turn, and the state
each turn acted from (the environment's `state()`, or the episode's observations so far: GiGPO's anchors).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxgrpo.engine.engine import Engine
from jaxgrpo.engine.sequences import Completion, Request
from jaxgrpo.envs import Environment, Message, Step
from jaxgrpo.sampler.distribution import SamplingParams

_MARK = "\x00jaxgrpo-content\x00"  # stands for a message's content while rendering a template's framing


class ChatTurns:
    """Token ids of a conversation's turns from a tokenizer's chat template, each part encoded once.

    `opening(messages)`: the first messages and the assistant's generation prompt. `observation(messages,
    stopped)`: what the template puts after an assistant turn that ended with the stop token (`stopped`) or was
    cut by its budget (then the turn's end marker is added too), then `messages`, then the generation prompt.
    """

    def __init__(self, tokenizer, stop_token: int | None = None):
        self.tokenizer = tokenizer
        self.stop_token = int(tokenizer.eos_token_id if stop_token is None else stop_token)
        self.stop_text = tokenizer.decode([self.stop_token], skip_special_tokens=False)
        conversation = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _MARK}]
        rendered = self._render(conversation, generation_prompt=False)
        if rendered.count(_MARK) != 1:
            raise ValueError("the chat template does not render an assistant message's content once; multi-turn "
                             "rollouts need a template that does")
        self._conversation, self._rendered = conversation, rendered
        after = rendered[rendered.index(_MARK) + len(_MARK):]  # what closes an assistant turn ("<|im_end|>\n")
        if not after.startswith(self.stop_text):
            raise ValueError(f"the chat template closes an assistant turn with {after!r}, not with the stop token "
                             f"{self.stop_text!r}; give ChatTurns the stop token the template uses")
        self._after_stop, self._closing = after[len(self.stop_text):], after

    def _render(self, messages, *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt,
                                                  tokenize=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def opening(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self._render(messages, generation_prompt=True))

    def observation(self, messages: Sequence[Message], stopped: bool = True) -> list[int]:
        full = self._render(self._conversation + list(messages), generation_prompt=True)
        if not full.startswith(self._rendered):
            raise ValueError("the chat template renders earlier turns differently once more messages follow; its "
                             "observations cannot be encoded alone")
        return self.encode((self._after_stop if stopped else self._closing) + full[len(self._rendered):])

    def check(self, env: Environment, example: Any) -> None:
        """Renders `env`'s opening for `example` and an observation in each role it answers with (its
        `observation_roles`, ("user",) when it declares none): a ValueError of one line when the template cannot."""
        roles = tuple(getattr(env, "observation_roles", ("user",)))
        for what, render in [("its opening", lambda: self.opening(env.reset(example)))] + [
                (f"a {role!r} message", lambda role=role: self.observation([{"role": role, "content": "1"}]))
                for role in roles]:
            try:
                render()
            except Exception as error:  # noqa: BLE001 — a template's own exception (jinja's, or raise_exception)
                raise ValueError(f"the chat template cannot render {what} ({type(error).__name__}: "
                                 f"{' '.join(str(error).split())})") from None

    def text(self, tokens: Sequence[int]) -> str:
        """A policy turn's text for the environment (its stop token dropped)."""
        tokens = list(tokens)
        if tokens and tokens[-1] == self.stop_token:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


@dataclasses.dataclass
class Trajectory:
    """One episode: `prompt` (the opening's tokens), then `tokens` [N] after it and per token `loss_mask` (the
    policy sampled it), `logprobs` (behaviour), `policy_logprobs`, `versions` (-1 where not sampled) and `turns`
    (the policy turn it belongs to or answers, from 0); `turn_rewards` per policy turn, `reward` their sum;
    `anchors` the state each policy turn acted from (hashable); `finish` is "done", "turns", "context" or
    "error"; `info` the environment's per turn."""

    example: int
    sample: int
    prompt: np.ndarray
    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    versions: np.ndarray
    turns: np.ndarray
    turn_rewards: list[float]
    finish: str
    info: list[dict]
    anchors: list = dataclasses.field(default_factory=list)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))


def demonstration(turns: ChatTurns, env: Environment, example: Any) -> tuple[list[int], list[int], list[bool]]:
    """(prompt, tokens after it, loss mask) of the episode `env.demonstration(example)` demonstrates, laid out as a
    rollout lays out a sampled one: the opening; each policy turn with its stop token (trained), then the
    observation answering it (attended to, not trained). A ValueError when the episode is not rewarded."""
    actions = env.demonstration(example)
    prompt = turns.opening(env.reset(example))
    tokens, mask, reward = [], [], 0.0
    for action in actions:
        ids = turns.encode(action) + [turns.stop_token]
        tokens, mask = tokens + ids, mask + [True] * len(ids)
        step = env.step(action)
        reward += float(step.reward)
        if step.done or not step.observation:
            break
        observation = turns.observation(step.observation, stopped=True)
        tokens, mask = tokens + observation, mask + [False] * len(observation)
    if reward <= 0:
        raise ValueError(f"{type(env).__name__}'s demonstration of {example!r} earns no reward ({reward}); "
                         "a warm-up would teach a failing episode")
    return prompt, tokens, mask


def _anchor(env: Environment, observations: list[Message]):
    """The state `env`'s next turn acts from: its `state()`, else the episode's observations so far."""
    state = getattr(env, "state", None)
    anchor = state() if callable(state) else tuple(m.get("content", "") for m in observations)
    try:
        hash(anchor)
    except TypeError:
        raise TypeError(f"{type(env).__name__}.state() returned an unhashable {type(anchor).__name__}; return a "
                        "tuple, string or number") from None
    return anchor


def _step_environment(env: Environment, action: str, timeout: float | None) -> tuple[Step | None, str | None]:
    """(the environment's step, None) or (None, why it failed: an exception or the timeout)."""
    if timeout is None:
        try:
            return env.step(action), None
        except Exception as error:  # noqa: BLE001 — an environment's failure ends its episode, not the run
            return None, f"{type(error).__name__}: {error}"
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(env.step, action).result(timeout=timeout), None
    except concurrent.futures.TimeoutError:
        return None, f"the environment's step took longer than {timeout} s"
    except Exception as error:  # noqa: BLE001
        return None, f"{type(error).__name__}: {error}"
    finally:
        pool.shutdown(wait=False)  # a step that overran keeps its thread; the episode is over either way


def rollout(engine: Engine, turns: ChatTurns, make_env: Callable[[], Environment], examples: Sequence[Any], *,
            group_size: int, max_turns: int, turn_tokens: int, sampling: SamplingParams = SamplingParams(),
            key: jax.Array | None = None, step_timeout: float | None = None,
            first_id: int = 0) -> tuple[list[Trajectory], dict[str, float]]:
    """`group_size` episodes of every example (see the module docstring); trajectories example-major.

    Episodes run in waves of whole groups that the engine's free slots hold, each wave's turns advancing
    together. Request ids are `first_id + example * group_size + sample` (the draws depend on them)."""
    if group_size < 1 or max_turns < 1 or turn_tokens < 1:
        raise ValueError(f"group_size, max_turns and turn_tokens must be >= 1; got {group_size}, {max_turns}, "
                         f"{turn_tokens}")
    if engine.num_slots < group_size:
        raise ValueError(f"a group of {group_size} episodes needs as many engine slots; the engine has "
                         f"{engine.num_slots}")
    if key is not None:
        engine.reseed(key)
    stats: collections.Counter = collections.Counter()
    trajectories: list[Trajectory] = []
    per_wave = max(1, engine.num_slots // group_size)
    indexed = list(enumerate(examples))
    for start in range(0, len(indexed), per_wave):
        wave = indexed[start:start + per_wave]
        trajectories += _wave(engine, turns, make_env, wave, group_size, max_turns, turn_tokens, sampling,
                              step_timeout, first_id, stats)
    stats["episodes"] = len(trajectories)
    return trajectories, dict(stats)


def _wave(engine, turns, make_env, wave, group_size, max_turns, turn_tokens, sampling, step_timeout, first_id,
          stats) -> list[Trajectory]:
    """The episodes of `wave` ((index, example) pairs), all admitted at once."""
    # request id -> [example index, sample, env, prompt, turn of each token after it, rewards, info, anchors,
    # observations so far]
    episodes = {}
    requests = []
    for index, example in wave:
        for sample in range(group_size):
            env = make_env()
            opening = env.reset(example)
            prompt = turns.opening(opening)
            request_id = first_id + index * group_size + sample
            episodes[request_id] = [index, sample, env, prompt, [], [], [], [_anchor(env, opening)], list(opening)]
            requests.append(Request(id=request_id, prompt=prompt, max_new_tokens=turn_tokens, sampling=sampling,
                                    stop_tokens=(turns.stop_token,)))
    engine.prefill(requests)
    finished: dict[int, tuple[Completion, str]] = {}
    for turn in range(max_turns):
        live = engine.decode()
        for request_id, completion in live.items():
            if request_id not in episodes or request_id in finished:
                continue
            index, sample, env, prompt, token_turns, rewards, info, anchors, seen = episodes[request_id]
            new = completion.tokens[len(token_turns):]
            token_turns += [turn] * len(new)
            step, failure = _step_environment(env, turns.text(new), step_timeout)
            if failure is not None:
                stats["environment_errors"] += 1
                rewards.append(float(getattr(env, "failure_reward", 0.0)))
                info.append({"error": failure})
                finished[request_id] = (engine.release(request_id), "error")
                continue
            rewards.append(float(step.reward))
            info.append(dict(step.info))
            if step.done or not step.observation:
                finished[request_id] = (engine.release(request_id), "done")
                continue
            if turn + 1 == max_turns:
                finished[request_id] = (engine.release(request_id), "turns")
                continue
            observation = turns.observation(step.observation, stopped=completion.finish_reason == "stop")
            room = engine.max_context - len(prompt) - len(completion.tokens) - 1
            if len(observation) + turn_tokens > room:
                stats["context_ends"] += 1
                finished[request_id] = (engine.release(request_id), "context")
                continue
            engine.extend(request_id, observation, turn_tokens)
            token_turns += [turn] * len(observation)  # an observation belongs to the turn it answers
            seen += step.observation
            anchors.append(_anchor(env, seen))
            stats["observation_tokens"] += len(observation)
    # Every episode ended above: by its last turn it was done, failed, out of room or out of turns.
    out = []
    for request_id, (index, sample, env, prompt, token_turns, rewards, info, anchors, _) in episodes.items():
        completion, finish = finished[request_id]
        stats["policy_tokens"] += int(completion.sampled.sum())
        stats["turns"] += len(rewards)
        out.append(Trajectory(example=index, sample=sample, prompt=np.asarray(prompt, np.int32),
                              tokens=completion.tokens, loss_mask=completion.sampled, logprobs=completion.logprobs,
                              policy_logprobs=completion.policy_logprobs, versions=completion.versions,
                              turns=np.asarray(token_turns, np.int32), turn_rewards=rewards, finish=finish, info=info,
                              anchors=anchors))
    return out
