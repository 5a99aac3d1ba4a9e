"""Answer extraction, equivalence, and the individual reward functions."""

from fractions import Fraction

import numpy as np
import pytest

from jaxgrpo.rewards import (
    answers_equivalent,
    correctness_reward,
    extract_final_answer,
    format_reward,
    length_penalty,
    overlong_penalty,
    parse_number,
)
from tests.support.paths import REPO_ROOT


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("The answer is 1,234.", Fraction(1234)),  # thousands separator, trailing period
        ("The answer is $18.", Fraction(18)),  # currency
        ("She makes $1,000,000 dollars. The answer is $1,000,000 dollars.", Fraction(10**6)),
        ("The answer is 5 cm.", Fraction(5)),  # unit
        ("The answer is 12 eggs per day.", Fraction(12)),
        ("The answer is -7.", Fraction(-7)),  # negative
        ("The answer is \u22127.", Fraction(-7)),  # unicode minus
        ("The answer is 0.75.", Fraction(3, 4)),  # decimal
        ("The answer is 3/4.", Fraction(3, 4)),  # fraction
        ("So x = \\boxed{\\frac{3}{4}}", Fraction(3, 4)),  # LaTeX fraction in a box
        ("\\boxed{1234}", Fraction(1234)),
        ("\\boxed{\\$1,234.00}", Fraction(1234)),
        ("First 3, then 4, so \\boxed{7}. Check: 3+4=7, 10 apples", Fraction(7)),  # the box beats later numbers
        ("The answer is 45, since 3 * 15 = 45.", Fraction(45)),
        ("The answer is 12. Check: 5 + 7 = 12 and 2 * 6 = 12 out of 100", Fraction(12)),  # statement beats later numbers
        ("It is 5, no wait, 7", Fraction(7)),  # no statement: the last number wins
        ("The answer is 5. Wait, recount. The answer is 6.", Fraction(6)),  # the final statement wins
        ("The answer is 5 - 3 = 2.", Fraction(2)),
        ("The answer is 20 = 4 + 7 + 9.", Fraction(20)),  # the side of "=" that is a number
        ("#### 72", Fraction(72)),  # GSM8K's own marker
        ("Answer: 50%", Fraction(50)),
        ("The answer is .5", Fraction(1, 2)),
    ],
)
def test_extracts_the_final_answer_of_a_completion(completion, expected):
    assert parse_number(extract_final_answer(completion)) == expected


def test_restating_the_question_unevaluated_is_not_an_answer():
    """"The answer is 4 + 7 + 9." states no number: a policy trained on the arithmetic task found within 15 steps
    that the verifier used to evaluate it (training accuracy 1.0 on an AMD EPYC, seed 0); it scores 0, and is
    not well-formed, while the same arithmetic carried to its result is both."""
    example = {"question": "What is 4 + 7 + 9?", "answer": "20"}
    completions = ["The answer is 4 + 7 + 9.", "The answer is 4+7+9", "The answer is (4 + 7) + 9.", "The answer is 2 * 10.",
                   "The answer is 4 + 7 + 9 = 20.", "4 + 7 + 9 = 20. The answer is 20."]
    np.testing.assert_array_equal(correctness_reward(completions, [example] * 6), [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(format_reward(completions, [example] * 6), [0, 0, 0, 0, 1, 1])
    for text in ("4 + 7 + 9", "2 * 10", "40 / 2 / 1", "1 - -19"):
        assert parse_number(text) is None, text


@pytest.mark.parametrize("completion", ["", "I do not know.", "The answer is twelve."])
def test_a_completion_without_a_number_has_no_numeric_answer(completion):
    assert parse_number(extract_final_answer(completion)) is None


@pytest.mark.parametrize(
    "predicted, gold",
    [("1,234.0", "1234"), ("0.5", "\\frac{1}{2}"), ("1/2", "0.50"), ("-3", "-3"), ("$18", "18"), ("7.", "7")],
)
def test_equal_values_written_differently_are_equivalent(predicted, gold):
    assert answers_equivalent(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [("-3", "3"), ("12", "120"), ("0.33", "1/3"), (None, "3"), ("3", "x")])
def test_different_values_are_not_equivalent(predicted, gold):
    assert not answers_equivalent(predicted, gold)


def test_non_numeric_answers_compare_as_normalized_text():
    assert answers_equivalent("\\text{ Yes }", "yes")
    assert not answers_equivalent("no", "yes")


@pytest.mark.parametrize("text", ["2**1000000", "__import__('os')", "1/0", "9" * 200, "(1"])
def test_parse_number_rejects_non_arithmetic_or_unsafe_text(text):
    assert parse_number(text) is None


def test_correctness_reward_scores_each_completion_against_its_own_example():
    examples = [{"answer": "8"}, {"answer": "8"}, {"answer": "1200"}]
    completions = ["3 + 5 = 8. The answer is 8.", "The answer is 9.", "It costs $1,200."]
    rewards = correctness_reward(completions, examples)
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0])


def test_correctness_reward_names_a_length_mismatch():
    with pytest.raises(ValueError, match="completions has 2 entries but examples has 1"):
        correctness_reward(["a", "b"], [{"answer": "1"}])


def test_format_reward_requires_a_stated_numeric_answer():
    completions = [
        "3 + 5 = 8. The answer is 8.",
        "\\boxed{8}",
        "The final answer is: -1,200.5",
        "8",  # a bare number does not follow the format
        "The answer is N.",  # the placeholder is not an answer
        "\\boxed{eight}",
    ]
    np.testing.assert_array_equal(format_reward(completions, [{}] * len(completions)), [1, 1, 1, 0, 0, 0])


def test_overlong_penalty_matches_dapo():
    # DAPO defaults L_max=20480, L_cache=4096 (METHODS.md §2.3): 18432 tokens -> -0.5.
    lengths = np.array([100, 16384, 18432, 20480, 20481])
    penalty = overlong_penalty(["x"] * 5, [{}] * 5, completion_lengths=lengths)
    assert penalty.dtype == np.float32
    np.testing.assert_allclose(penalty, [0.0, 0.0, -0.5, -1.0, -1.0])


def test_overlong_penalty_with_a_short_generation_limit():
    penalty = overlong_penalty(["x"] * 3, [{}] * 3, completion_lengths=np.array([96, 112, 128]), max_length=128, cache_length=32)
    np.testing.assert_allclose(penalty, [0.0, -0.5, -1.0])


def test_length_penalty_is_linear_beyond_the_budget():
    penalty = length_penalty(["x"] * 4, [{}] * 4, completion_lengths=np.array([10, 100, 150, 400]), target_length=100)
    np.testing.assert_allclose(penalty, [0.0, 0.0, -0.5, -1.0])


@pytest.mark.parametrize("reward_fn", [overlong_penalty, length_penalty])
def test_length_rewards_ask_for_token_counts(reward_fn):
    with pytest.raises(ValueError, match="completion_lengths"):
        reward_fn(["x"], [{}])
    with pytest.raises(ValueError, match=r"completion_lengths has shape \(2,\) but there are 1 completions"):
        reward_fn(["x"], [{}], completion_lengths=np.array([1, 2]))


def test_overlong_penalty_names_an_impossible_cache_window():
    with pytest.raises(ValueError, match="cache_length <= max_length"):
        overlong_penalty(["x"], [{}], completion_lengths=np.array([1]), max_length=8, cache_length=16)


def test_majority_vote_reward_rewards_agreement_with_each_questions_majority_without_reading_labels():
    from jaxgrpo.rewards import majority_answers, majority_vote_reward

    completions = ["The answer is 3.", "So 3.0. The answer is 3.0.", "The answer is 5.", "I do not know.",
                   "The answer is 7.", "The answer is 8."]
    examples = [{"question": "q1", "answer": "999"}] * 4 + [{"question": "q2", "answer": "999"}] * 2
    # q1: 3 and 3.0 vote together against 5, the unstated answer gets 0; q2: a tie goes to the earliest answer.
    np.testing.assert_array_equal(majority_vote_reward(completions, examples), [1, 1, 0, 0, 1, 0])
    assert majority_answers([None, "1/2", "0.5", "2"]) == "1/2" and majority_answers([None, None]) is None
    assert majority_vote_reward(["none", "nothing"], [{"question": "q"}] * 2).tolist() == [0, 0]


def test_the_ttrl_experiment_trains_on_the_vote_and_measures_the_labels():
    import os

    from jaxgrpo.config import load_experiment, validate
    from jaxgrpo.data.tasks import ArithmeticTask
    from jaxgrpo.train import rollout

    cfg = load_experiment(os.path.join(REPO_ROOT, "experiments", "ttrl.py"))
    validate(cfg)
    reward_fns = rollout.resolve_rewards(cfg, ArithmeticTask())
    texts = ["The answer is 4.", "The answer is 4.", "The answer is 5."]
    examples = [{"question": "What is 1 + 1 + 3?", "answer": "5"}] * 3
    result = rollout.score(cfg, reward_fns, texts, examples, np.full(3, 6, np.int32))
    np.testing.assert_array_equal(result.per_reward["majority_vote_reward"], [1, 1, 0])
    np.testing.assert_array_equal(result.per_reward["correctness_reward"], [0, 0, 1])  # measured, weight 0
    weights = dict((name, w) for name, w in cfg.rewards.items())
    np.testing.assert_allclose(result.rewards, [1 + weights["format_reward"]] * 2 + [weights["format_reward"]])
