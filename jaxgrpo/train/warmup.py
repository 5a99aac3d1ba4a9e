"""Supervised warm-up before RL: the update's likelihood term on the task's reference answers.

A tiny random model cannot sample a correct answer at all; a few teacher-forced steps give it the
partial competence that makes group-relative RL work. The warm-up runs the same jitted update as RL
(`step.make_update_fn`) with the likelihood objective (`step.likelihood_objective`) and its own Adam.
"""

from __future__ import annotations

import numpy as np

from jaxgrpo.train.step import TrainBatch


def reference_completion(task, tokenizer, example: dict) -> list[int]:
    """Token ids of a correct completion: the task's own, else "The answer is N.", then EOS."""
    text = getattr(task, "reference_completion", None)
    text = text(example) if text else f"The answer is {example['answer']}."
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    eos = getattr(tokenizer, "eos_token_id", None)
    return ids + [eos] if eos is not None else ids


def supervised_batch(prompts: list[list[int]], answers: list[list[int]], pad_id: int) -> TrainBatch:
    """One micro-batch [1, B, ...] of prompts (left padded) followed by their answers, the answers trained."""
    batch_size = len(prompts)
    width = max(map(len, prompts))
    cwidth = max(map(len, answers))
    tokens = np.full((batch_size, width + cwidth), pad_id, np.int32)
    attention = np.zeros(tokens.shape, bool)
    mask = np.zeros((batch_size, cwidth), np.float32)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        tokens[i, width - len(p) : width] = p
        tokens[i, width : width + len(a)] = a
        attention[i, width - len(p) : width + len(a)] = True
        mask[i, : len(a)] = 1.0
    positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
    zeros = np.zeros_like(mask)
    return TrainBatch(*(x[None] for x in (tokens, attention, positions, mask, zeros, zeros, zeros, zeros, zeros)))
