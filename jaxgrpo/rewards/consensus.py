"""Label-free rewards: the completions of a question vote on its answer.

`majority_vote_reward` is the self-reward of test-time reinforcement learning (TTRL, Zuo et al., "TTRL:
Test-Time Reinforcement Learning", 2025) and of MM-UPT (Wei et al., "Unsupervised Post-Training for
Multi-Modal LLM Reasoning via GRPO", 2025): the answer most of a question's sampled completions state is
taken as its label, and each completion is rewarded 1 when its answer equals it. The examples' answers are
never read, so a run can train on unlabelled questions and still measure accuracy on the labels with a
`correctness_reward` of weight 0.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxgrpo.rewards.math import answers_equivalent, check_batch, extract_final_answer


def majority_answers(answers: Sequence[str | None]) -> str | None:
    """The most common of `answers` up to equivalence (`answers_equivalent`: "0.5" and "1/2" vote together),
    the earliest stated among equally common ones; None when no answer is stated."""
    classes: list[list] = []  # [representative, votes], in order of first appearance
    for answer in answers:
        if answer is None:
            continue
        for entry in classes:
            if answers_equivalent(answer, entry[0]):
                entry[1] += 1
                break
        else:
            classes.append([answer, 1])
    return max(classes, key=lambda entry: entry[1])[0] if classes else None  # max keeps the first of a tie


def majority_vote_reward(completions: Sequence[str], examples: Sequence[dict], **unused_context) -> np.ndarray:
    """1.0 where the completion's final answer equals the majority answer of the completions of the same
    question in the batch (its group: rows whose examples have the same ``"question"``), else 0.0.

    A completion without a final answer does not vote and gets 0; a question whose completions state no answer
    gives all of them 0. ``example["answer"]`` is not read.

    Returns:
      f32[N], one reward per completion.
    """
    check_batch(completions, examples)
    answers = [extract_final_answer(c) for c in completions]
    groups: dict[str, list[int]] = {}
    for row, example in enumerate(examples):
        groups.setdefault(str(example["question"]), []).append(row)
    rewards = np.zeros(len(completions), np.float32)
    for rows in groups.values():
        label = majority_answers([answers[r] for r in rows])
        if label is not None:
            rewards[rows] = [answers_equivalent(answers[r], label) for r in rows]
    return rewards
