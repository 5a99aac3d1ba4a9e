"""Accuracy and pass@k: the unbiased estimator of Chen et al. (2021), by hand and by brute force."""

import itertools
import json
import math

import numpy as np
import pytest

from jaxgrpo.data import evaluate as evaluation


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (2, 1, 1, 0.5),
        (10, 0, 5, 0.0),
        (4, 4, 2, 1.0),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (8, 1, 4, 0.5),  # 1 - C(7,4)/C(8,4) = 1 - 35/70
        (3, 2, 2, 1.0),  # fewer than k wrong samples
    ],
)
def test_pass_at_k_golden_values(n, c, k, expected):
    assert evaluation.pass_at_k(np.array([n]), np.array([c]), k)[0] == pytest.approx(expected)


def test_pass_at_k_equals_enumerating_all_draws():
    for n, k in [(6, 1), (6, 3), (7, 4)]:
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            draws = list(itertools.combinations(outcomes, k))
            brute_force = sum(any(draw) for draw in draws) / len(draws)
            assert evaluation.pass_at_k(np.array([n]), np.array([c]), k)[0] == pytest.approx(brute_force)
            assert brute_force == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_names_too_few_samples():
    with pytest.raises(ValueError, match="pass@5 needs k >= 1 and at least k samples per problem, got n = 4"):
        evaluation.pass_at_k(np.array([4, 8]), np.array([1, 1]), 5)


EXAMPLES = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 + 4?", "answer": "8"}]
COMPLETIONS = [
    ["The answer is 5.", "The answer is 6.", "The answer is 5.", "The answer is 1."],  # 2 of 4
    ["The answer is 7.", "The answer is 9.", "I give up.", "The answer is 8."],  # 1 of 4
]


def test_evaluate_reports_accuracy_and_pass_at_k():
    results = evaluation.evaluate(COMPLETIONS, EXAMPLES, k_values=(1, 2, 4))
    assert results["accuracy"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert results["pass@1"] == pytest.approx(results["accuracy"])
    # pass@2: (1 - C(2,2)/C(4,2)) and (1 - C(3,2)/C(4,2)) -> (5/6 + 1/2) / 2.
    assert results["pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert results["pass@4"] == 1.0
    assert results["num_examples"] == 2 and results["samples_per_example"] == 4


def test_evaluate_names_misaligned_inputs():
    with pytest.raises(ValueError, match="completions has 1 entries but examples has 2"):
        evaluation.evaluate(COMPLETIONS[:1], EXAMPLES)
    with pytest.raises(ValueError, match="example 1 has no completions"):
        evaluation.evaluate([["The answer is 5."], []], EXAMPLES)


def test_command_line_evaluates_a_completions_file(tmp_path, capsys):
    tfds_dir = tmp_path / "tfds"
    task_name = "arithmetic/digits1_ops2_train8_test4"
    from jaxgrpo.data import get_task

    examples = get_task(task_name, tfds_data_dir=str(tfds_dir)).load("test")
    path = tmp_path / "samples.jsonl"
    lines = [{"index": 3, "completions": [f"The answer is {examples[3]['answer']}.", "The answer is -1."]}]
    lines += [{"index": i, "completions": ["The answer is -1.", "no idea"]} for i in range(3)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    capsys.readouterr()  # Drop TFDS's preparation log.
    results = evaluation.main(
        ["--task", task_name, "--tfds_data_dir", str(tfds_dir), "--completions", str(path), "--k", "1", "2"]
    )
    assert results["accuracy"] == pytest.approx(0.5 / 4)
    assert results["pass@2"] == pytest.approx(1 / 4)
    assert json.loads(capsys.readouterr().out) == results


def test_command_line_names_a_malformed_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"completions": ["a"]}) + "\n" + json.dumps({"completions": "a"}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: malformed .*must be a list of strings"):
        evaluation._read_completions(str(path), num_examples=10)
