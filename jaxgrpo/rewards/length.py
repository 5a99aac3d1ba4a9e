"""Length shaping in tokens: DAPO's soft overlong punishment and a linear length penalty.

These rewards need the number of tokens of each completion, which text alone
does not give; `jaxgrpo.rewards.score` forwards it as the keyword
``completion_lengths`` (int[N], tokens of each completion, EOS included or not
as the sampler counts them). Signature::

    reward_fn(completions, examples, *, completion_lengths: np.ndarray | None, ...) -> np.ndarray  # f32[N]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _lengths(completions: Sequence[str], completion_lengths: np.ndarray | None, reward_name: str) -> np.ndarray:
    if completion_lengths is None:
        raise ValueError(
            f"{reward_name} needs token counts: pass completion_lengths=int[N] "
            "(to jaxgrpo.rewards.score, which forwards it to every reward that takes it)"
        )
    lengths = np.asarray(completion_lengths)
    if lengths.shape != (len(completions),):
        raise ValueError(
            f"completion_lengths has shape {lengths.shape} but there are {len(completions)} completions; "
            "pass one token count per completion"
        )
    return lengths.astype(np.float32)


def overlong_penalty(
    completions: Sequence[str],
    examples: Sequence[dict],
    *,
    completion_lengths: np.ndarray | None = None,
    max_length: int = 20480,
    cache_length: int = 4096,
    **unused_context,
) -> np.ndarray:
    """Soft overlong punishment of DAPO: 0 when short, a linear ramp to -1 near the limit.

    With L = completion length in tokens, L_max = ``max_length`` and
    L_cache = ``cache_length``::

        R(L) = 0                          if L <= L_max - L_cache
               (L_max - L_cache - L) / L_cache   if L_max - L_cache < L <= L_max
               -1                         if L > L_max

    From "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
    (Yu et al., 2025); defaults L_max=20480, L_cache=4096 are the paper's. Set
    ``max_length`` to the sampler's generation limit.

    Returns:
      f32[N] in [-1, 0].
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got cache_length={cache_length}, max_length={max_length}")
    lengths = _lengths(completions, completion_lengths, "overlong_penalty")
    ramp = (max_length - cache_length - lengths) / cache_length
    return np.clip(ramp, -1.0, 0.0).astype(np.float32)


def length_penalty(
    completions: Sequence[str],
    examples: Sequence[dict],
    *,
    completion_lengths: np.ndarray | None = None,
    target_length: int = 512,
    **unused_context,
) -> np.ndarray:
    """Linear penalty for every token beyond a budget: -max(0, L - target) / target, floored at -1.

    A token-budget length reward in the spirit of "Train Long, Think Short:
    Curriculum Learning for Efficient Reasoning" (2025): completions within
    ``target_length`` tokens are not penalized, and one twice as long as the
    budget gets the full -1. ``target_length=512`` is a jaxgrpo default, not a
    paper's.

    Returns:
      f32[N] in [-1, 0].
    """
    if target_length <= 0:
        raise ValueError(f"target_length must be positive, got {target_length}")
    lengths = _lengths(completions, completion_lengths, "length_penalty")
    return np.clip(-(lengths - target_length) / target_length, -1.0, 0.0).astype(np.float32)
