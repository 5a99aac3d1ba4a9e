"""correctness_reward on all 1319 GSM8K test problems: gold answers as a model writes them score 1, perturbed 0."""

import os

import numpy as np
import pytest

from jaxgrpo.data import get_task
from jaxgrpo.rewards import correctness_reward


@pytest.fixture(scope="module")
def gsm8k_test(tmp_path_factory, shared_dir):
    # Same directory as test_data_gsm8k.py's session fixture: prepared once per session.
    task = get_task("gsm8k", tfds_data_dir=str(tmp_path_factory.getbasetemp() / "tfds_gsm8k"))
    examples = list(task.load("test", data_dir=os.path.join(shared_dir, "data", "gsm8k")))
    assert len(examples) == 1319
    return examples


def written_as_a_model_would(value: int, style: int) -> str:
    """A completion stating ``value`` in one of several styles: separators, $, units, boxes, work shown."""
    styles = [
        f"The answer is {value:,}.",
        f"Let me think step by step. First, 3 + 4 = 7. Then 7 * 2 = 14.\n\\boxed{{{value}}}",
        f"So she pays ${value:,} in total. The answer is ${value:,}.",
        f"The answer is {value} dollars.",
        f"We get {value - 1} + 1 = {value}. #### {value}",
        f"The final answer is \\boxed{{{value:,}}}. (Checked twice: 2 * 3 = 6.)",
        f"Answer: {value}.0",
    ]
    return styles[style % len(styles)]


def test_gold_answers_score_one_and_perturbed_answers_zero(gsm8k_test):
    gold = [int(example["answer"]) for example in gsm8k_test]
    correct = [written_as_a_model_would(value, i) for i, value in enumerate(gold)]
    np.testing.assert_array_equal(correctness_reward(correct, gsm8k_test), np.ones(len(gold)))

    off_by_one = [written_as_a_model_would(value + 1, i) for i, value in enumerate(gold)]
    np.testing.assert_array_equal(correctness_reward(off_by_one, gsm8k_test), np.zeros(len(gold)))
    # The gold value appears, but a different final answer is stated last.
    restated = [f"First I thought {value}. The answer is {value * 10 + 3}." for value in gold]
    np.testing.assert_array_equal(correctness_reward(restated, gsm8k_test), np.zeros(len(gold)))


def test_every_style_scores_the_gold_answer_of_every_problem(gsm8k_test):
    gold = [int(example["answer"]) for example in gsm8k_test]
    for style in range(7):
        completions = [written_as_a_model_would(value, style) for value in gold]
        assert correctness_reward(completions, gsm8k_test).all(), f"style {style}"


def test_the_reference_solution_scores_one(gsm8k_test):
    solutions = [example["solution"] for example in gsm8k_test]
    np.testing.assert_array_equal(correctness_reward(solutions, gsm8k_test), np.ones(len(solutions)))
