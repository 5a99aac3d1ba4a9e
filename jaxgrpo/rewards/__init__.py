"""Verifiable rewards for GRPO-family training, and their weighted combination.

Every reward function has one signature::

    reward_fn(completions: list[str], examples: Sequence[dict], **context) -> np.ndarray  # f32[N]

``examples[i]`` is the task example that completion ``i`` answers (a dict with
at least ``"question"`` and ``"answer"``, the exact final answer as a string).
``context`` carries optional per-batch inputs; the one defined today is
``completion_lengths: np.ndarray | None`` (int[N], tokens per completion), which
the length rewards need. A reward takes the context keywords it needs and may
ignore the rest (`score` passes each reward only the keywords it accepts).

`score` combines ``[(reward_fn, weight), ...]`` into a `RewardResult`
(weighted sum, per-reward values, valid mask, invalid count); a reward that
raises or returns NaN on one sample invalidates that sample, not the batch.

Rewards:
  correctness_reward  1/0 by final-answer equivalence (`jaxgrpo.rewards.math`).
  majority_vote_reward  1/0 by agreement with the majority answer of the question's completions: label-free
                      (TTRL, MM-UPT; `jaxgrpo.rewards.consensus`).
  format_reward       1/0: the completion states "The answer is N." or \\boxed{N}.
  overlong_penalty    DAPO's soft overlong punishment, in tokens.
  length_penalty      linear penalty beyond a token budget.
"""

from jaxgrpo.rewards.combine import RewardFn, RewardResult, reward_name, score
from jaxgrpo.rewards.consensus import majority_answers, majority_vote_reward
from jaxgrpo.rewards.format import format_reward, states_final_answer
from jaxgrpo.rewards.length import length_penalty, overlong_penalty
from jaxgrpo.rewards.math import answers_equivalent, correctness_reward, extract_final_answer, parse_number

__all__ = [
    "RewardFn",
    "RewardResult",
    "answers_equivalent",
    "correctness_reward",
    "extract_final_answer",
    "format_reward",
    "length_penalty",
    "majority_answers",
    "majority_vote_reward",
    "overlong_penalty",
    "parse_number",
    "reward_name",
    "score",
    "states_final_answer",
]
