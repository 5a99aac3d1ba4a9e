"""What goes in and out of the rollout engine (`Request`, `Completion`), its host-side record of a sequence in a
decode slot (`LiveSequence`), and which running sequences a decode chunk reads a shared prompt for once
(`plan_prefix_rows`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxgrpo.sampler.distribution import SamplingParams


@dataclasses.dataclass(frozen=True)
class Request:
    """What to generate.

    Attributes:
      id: an int naming the request: its random stream (see the module docstring) and its sequence id in the
        session API; unique among the requests in flight. For G samples of prompt b, `b * G + g`.
      prompt: token ids (non-empty).
      max_new_tokens: the most tokens to sample (>= 1).
      sampling: the distribution to draw from.
      stop_tokens: ids that end the completion (kept in it), at most `STOP_SLOTS`.
      draw_origin: the position whose token is draw 0 of the request's random stream (see the module
        docstring): 0 counts draws from the sequence's start, so a sequence continued by `extend` draws what a
        request with its whole history as the prompt (and the same id and origin) would; the prompt's length
        counts them from the completion's start (`generate_groups`).
    """

    id: int
    prompt: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_tokens: tuple[int, ...] = ()
    draw_origin: int = 0


@dataclasses.dataclass
class Completion:
    """A finished (or, from `decode`, live) sequence after its prompt.

    Attributes:
      request_id: the `Request.id`.
      prompt: the prompt's token ids.
      tokens: int32 [N], every token after the prompt: sampled ones and those `extend` appended.
      sampled: bool [N], True where the policy sampled the token (the loss mask of a multi-turn rollout).
      logprobs: float32 [N], log-prob under the distribution the token was drawn from (0 where not sampled).
      policy_logprobs: float32 [N], `log_softmax(logits / temperature)` of the token (0 where not sampled).
      versions: int32 [N], the policy version that sampled each token (-1 where not sampled).
      finish_reason: "stop" (a stop token), "length" (the budget) or None (still running).
    """

    request_id: int
    prompt: np.ndarray
    tokens: np.ndarray
    sampled: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str | None

    @property
    def sampled_tokens(self) -> np.ndarray:
        return self.tokens[self.sampled]


@dataclasses.dataclass
class LiveSequence:
    """The host's record of a sequence in a slot. Positions [0, length) are in the cache; `pending`, the last
    token sampled, is not yet (it is the next step's input)."""

    request: Request
    slot: int
    blocks: list[int]
    length: int
    pending: int
    remaining: int  # tokens it may still sample
    shard: int = 0  # the row shard holding its slot and blocks (`blocks` are ids in that shard's part of the pool)
    # Its first `shared` positions hold the same keys and values as those of the other sequences of its `group`
    # (the samples of a prompt prefilled together: its full blocks shared, its partial last block copied), so a
    # decode chunk may read them once for the group through any member's blocks.
    shared: int = 0
    group: int = -1
    finish_reason: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    sampled: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    policy_logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    def record(self, token: int, logprob: float, policy_logprob: float, version: int, stops: set[int]) -> None:
        self.tokens.append(int(token))
        self.sampled.append(True)
        self.logprobs.append(float(logprob))
        self.policy_logprobs.append(float(policy_logprob))
        self.versions.append(int(version))
        self.pending = int(token)
        self.remaining -= 1
        if int(token) in stops:
            self.finish_reason = "stop"
        elif self.remaining <= 0:
            self.finish_reason = "length"

    def completion(self) -> Completion:
        return Completion(
            request_id=self.request.id, prompt=np.asarray(self.request.prompt, np.int32),
            tokens=np.asarray(self.tokens, np.int32), sampled=np.asarray(self.sampled, bool),
            logprobs=np.asarray(self.logprobs, np.float32), policy_logprobs=np.asarray(self.policy_logprobs, np.float32),
            versions=np.asarray(self.versions, np.int32), finish_reason=self.finish_reason)


def token_list(tokens) -> list[int]:
    """A prompt (any sequence or array of token ids) as a flat list of Python ints."""
    return [int(t) for t in np.asarray(tokens).reshape(-1)]


def prefix_key(sequence: LiveSequence) -> tuple[int, int] | None:
    """The sequences whose first `shared` positions a decode chunk may read once for them all have one key (their
    shard and prefix group); None for a sequence that shares none."""
    return (sequence.shard, sequence.group) if sequence.shared else None


def plan_prefix_rows(rows: Sequence[LiveSequence | None], share: int) -> list[tuple[list[LiveSequence], bool]]:
    """`len(rows) // share` groups of at most `share` of the running `rows` (None: an empty slot), each with
    whether its members share a prompt's positions (read once for them) or each read their own.

    Every running row is in one group. The prompts with the most running samples are given groups first
    (one group per `share` samples), as long as the rows left over still fit the groups that remain, `share`
    to a group; the other rows fill those.
    """
    capacity = len(rows) // share
    groups: dict[Any, list[LiveSequence]] = {}
    for sequence in rows:
        if sequence is not None:
            groups.setdefault(prefix_key(sequence), []).append(sequence)
    singles = groups.pop(None, [])
    candidates = sorted(groups.values(), key=len, reverse=True)
    unshared = len(singles) + sum(map(len, candidates))  # rows without a shared group, before any is given one
    used, plan, own = 0, [], list(singles)
    for members in candidates:
        need = -(-len(members) // share)
        if len(members) >= 2 and used + need + -(-(unshared - len(members)) // share) <= capacity:
            plan += [(members[i:i + share], True) for i in range(0, len(members), share)]
            used, unshared = used + need, unshared - len(members)
        else:
            own += members
    plan += [(own[i:i + share], False) for i in range(0, len(own), share)]
    return plan + [([], False)] * (capacity - len(plan))
