"""The procedural arithmetic task: determinism, exact answers, difficulty, splits, TFDS builder."""

import ast
import sys

import pytest

from jaxgrpo.data import arithmetic


def small_config(**kwargs):
    kwargs = {"train_size": 300, "test_size": 40, **kwargs}
    return arithmetic.arithmetic_config(**kwargs)


def reference_value(expression: str) -> int:
    """Python's own integer arithmetic on the generated expression (digits and + - * only)."""
    tree = ast.parse(expression, mode="eval")
    assert all(isinstance(node, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult)) for node in ast.walk(tree))
    return eval(compile(tree, "<expression>", "eval"))


def test_the_same_seed_gives_the_same_examples():
    config = small_config(seed=3)
    assert arithmetic.generate_split(config, "train") == arithmetic.generate_split(small_config(seed=3), "train")
    assert arithmetic.generate_split(config, "train") != arithmetic.generate_split(small_config(seed=4), "train")


@pytest.mark.parametrize("operators", ["+", "+-", "+-*"])
def test_answers_are_exact(operators):
    config = small_config(digits=3, operands=4, operators=operators)
    for example in arithmetic.generate_split(config, "train"):
        assert example["answer"] == str(reference_value(example["expression"]))
        assert example["question"] == f"What is {example['expression']}?"


def test_precedence_is_multiplication_first():
    assert arithmetic.evaluate_expression([2, 3, 4], ["+", "*"]) == 14
    assert arithmetic.evaluate_expression([2, 3, 4, 5], ["*", "-", "*"]) == -14


@pytest.mark.parametrize("digits, operands, operators", [(1, 2, "+"), (2, 3, "+-"), (4, 5, "*")])
def test_difficulty_sets_digits_operands_and_operators(digits, operands, operators):
    config = small_config(digits=digits, operands=operands, operators=operators)
    for example in arithmetic.generate_split(config, "test"):
        tokens = example["expression"].split(" ")
        numbers, used_operators = tokens[::2], tokens[1::2]
        assert len(numbers) == operands
        assert all(len(n) == digits for n in numbers)
        assert set(used_operators) <= set(operators)


def test_a_larger_split_extends_a_smaller_one():
    small = arithmetic.generate_split(small_config(train_size=50), "train")
    large = arithmetic.generate_split(small_config(train_size=120), "train")
    assert large[:50] == small


@pytest.mark.parametrize("digits, operands", [(1, 2), (2, 2), (2, 3)])
def test_train_and_test_share_no_question(digits, operands):
    config = small_config(digits=digits, operands=operands, train_size=1000, test_size=200)
    train = {e["question"] for e in arithmetic.generate_split(config, "train")}
    test = {e["question"] for e in arithmetic.generate_split(config, "test")}
    assert train and test and not train & test


def test_a_smaller_test_share_holds_out_more_distinct_questions():
    # One-digit sums of three operands: 1000 questions, about 100 held out at the default share of 1 in 10
    # and about 500 at 1 in 2; each split keeps to its own questions.
    def distinct(split, **kwargs):
        config = small_config(digits=1, operands=3, train_size=2000, test_size=600, **kwargs)
        return {e["question"] for e in arithmetic.generate_split(config, split)}

    default, halved = distinct("test"), distinct("test", test_share=2)
    assert len(default) <= 120 and len(halved) >= 250
    assert not halved & distinct("train", test_share=2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({}, "digits2_ops2"),
        ({"digits": 1, "operands": 3}, "digits1_ops3"),
        ({"operators": "+-*", "seed": 7}, "digits2_ops2_add_sub_mul_seed7"),
        ({"train_size": 64, "test_size": 8}, "digits2_ops2_train64_test8"),
        ({"digits": 1, "operands": 3, "test_share": 2}, "digits1_ops3_share2"),
    ],
)
def test_config_names_round_trip(kwargs, name):
    config = arithmetic.arithmetic_config(**kwargs)
    assert config.name == name
    assert arithmetic.arithmetic_config(**arithmetic.parse_config_name(name)).name == name


def test_predefined_configs_are_reused():
    assert arithmetic.arithmetic_config(digits=2, operands=2) is arithmetic.Arithmetic.builder_configs["digits2_ops2"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"digits": 0}, "digits must be in"),
        ({"operands": 1}, "operands must be at least 2"),
        ({"operators": "+/"}, "operators must be distinct characters"),
        ({"train_size": -1}, "split sizes must be >= 0"),
        ({"test_share": 1}, "test_share must be at least 2"),
    ],
)
def test_bad_difficulty_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arithmetic.arithmetic_config(**kwargs)


def test_a_bad_config_name_shows_the_expected_form():
    with pytest.raises(ValueError, match="digits<d>_ops<n>"):
        arithmetic.parse_config_name("two_digits")


def test_builder_writes_array_record_read_back_without_tensorflow(tmp_path):
    config = small_config(seed=1, train_size=64, test_size=16)
    builder = arithmetic.Arithmetic(data_dir=str(tmp_path), config=config, file_format="array_record")
    builder.download_and_prepare()
    assert list(tmp_path.rglob("*.array_record*"))
    for split, size in (("train", 64), ("test", 16)):
        source = builder.as_data_source(split)
        assert len(source) == size
        stored = sorted(record["question"].decode() for record in source)
        assert stored == sorted(e["question"] for e in arithmetic.generate_split(config, split))
    assert "tensorflow" not in sys.modules
