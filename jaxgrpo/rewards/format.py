"""Format reward: did the completion state its final answer the way it was asked to?

Same signature as every reward in `jaxgrpo.rewards`::

    reward_fn(completions: list[str], examples: Sequence[dict], **context) -> np.ndarray  # f32[N]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from jaxgrpo.rewards import math as math_rewards

# "The answer is N." (optionally "final answer"), "$", sign, separators, decimals, fractions; N is a number,
# not the start of unevaluated arithmetic ("The answer is 4 + 7 + 9." states no number).
_ANSWER_STATEMENT_RE = re.compile(
    r"answer\s+is:?\s*\**\s*(?:" + math_rewards.NUMBER_PATTERN + r")\b(?!\s*[-+*/×]\s*[\d(])",
    flags=re.IGNORECASE,
)

_ANSWER_LINE_RE = re.compile(r"answer\s+is:?\s*([^\n]*)", flags=re.IGNORECASE)


def states_final_answer(completion: str) -> bool:
    """Whether ``completion`` states a numeric final answer as "The answer is N" or ``\\boxed{N}``."""
    completion = completion.translate(math_rewards.MINUS_SIGNS)
    boxed = math_rewards.last_boxed(completion)
    if boxed is not None and math_rewards.parse_number(boxed) is not None:
        return True
    if _ANSWER_STATEMENT_RE.search(completion) is not None:
        return True
    # "The answer is 4 + 7 + 9 = 20." states 20 after its arithmetic.
    return any("=" in m.group(1) and math_rewards.stated_number(m.group(1)) is not None
               for m in _ANSWER_LINE_RE.finditer(completion))


def format_reward(completions: Sequence[str], examples: Sequence[dict], **unused_context) -> np.ndarray:
    """1.0 where the completion states its final answer in the requested format, else 0.0.

    The requested format is "The answer is N." or ``\\boxed{N}`` (see
    `jaxgrpo.data` prompts). Correctness is not checked here: the R1-style
    format reward (DeepSeek-R1, 2025) rewards following the output protocol,
    which the verifier relies on, and is usually given a small weight beside
    `correctness_reward`.

    Returns:
      f32[N], one reward per completion.
    """
    math_rewards.check_batch(completions, examples)
    return np.array([states_final_answer(c) for c in completions], dtype=np.float32)
