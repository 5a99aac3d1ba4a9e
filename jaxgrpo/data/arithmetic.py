"""A procedural arithmetic task: seeded, any size, exact answers, controllable difficulty.

Each example asks for the value of an integer expression such as ``37 + 8 * 12``
(usual precedence: ``*`` before ``+`` and ``-``). Difficulty is set by

* ``digits``: every operand has exactly this many digits (0-9 when ``digits=1``);
* ``operands``: how many numbers the expression has (2 or more);
* ``operators``: which of ``+ - *`` may appear (``"+"`` is plain addition).

Generation is deterministic: example ``i`` of a split depends only on
``(seed, split, i)`` and the difficulty, so a larger split extends a smaller
one. Train and test never share a question: a keyed hash of the expression
assigns each possible question to exactly one split (1 in ``test_share`` to
test, 10 by default; a smaller share holds out more distinct questions).
When the space of questions is small (one-digit addition has 100), a split
larger than its share repeats questions.

The TFDS builder `Arithmetic` stores the examples as array_record, with one
builder config per difficulty, named like ``digits2_ops2`` (see
`arithmetic_config`); read them with ``builder.as_data_source(split)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np
import tensorflow_datasets as tfds

_OPERATOR_WORDS = {"+": "add", "-": "sub", "*": "mul"}
_SPLIT_IDS = {"train": 0, "test": 1}
# One question in DEFAULT_TEST_SHARE belongs to the test split.
DEFAULT_TEST_SHARE = 10
_MAX_TRIES_PER_EXAMPLE = 10_000
DEFAULT_TRAIN_SIZE = 10_000
DEFAULT_TEST_SIZE = 500


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(tfds.core.BuilderConfig):
    """A difficulty and size of the arithmetic task; make one with `arithmetic_config`."""

    digits: int = 2
    operands: int = 2
    operators: str = "+"
    seed: int = 0
    train_size: int = DEFAULT_TRAIN_SIZE
    test_size: int = DEFAULT_TEST_SIZE
    test_share: int = DEFAULT_TEST_SHARE


def config_name(digits: int, operands: int, operators: str, seed: int, train_size: int, test_size: int,
                test_share: int = DEFAULT_TEST_SHARE) -> str:
    """``digits{d}_ops{n}``, then ``_add_mul``-style operators, seed, sizes and test share when not the defaults."""
    parts = [f"digits{digits}", f"ops{operands}"]
    if operators != "+":
        parts.append("_".join(_OPERATOR_WORDS[op] for op in operators))
    if seed:
        parts.append(f"seed{seed}")
    if train_size != DEFAULT_TRAIN_SIZE:
        parts.append(f"train{train_size}")
    if test_size != DEFAULT_TEST_SIZE:
        parts.append(f"test{test_size}")
    if test_share != DEFAULT_TEST_SHARE:
        parts.append(f"share{test_share}")
    return "_".join(parts)


_NAME_RE = re.compile(
    r"digits(?P<digits>\d+)_ops(?P<operands>\d+)(?P<operators>(?:_(?:add|sub|mul))*)"
    r"(?:_seed(?P<seed>\d+))?(?:_train(?P<train_size>\d+))?(?:_test(?P<test_size>\d+))?(?:_share(?P<test_share>\d+))?"
)


def parse_config_name(name: str) -> dict:
    """Inverse of `config_name`: ``"digits2_ops3_add_mul_seed1"`` -> keyword arguments."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(
            f"arithmetic config name {name!r} is not of the form "
            "digits<d>_ops<n>[_add][_sub][_mul][_seed<s>][_train<n>][_test<n>][_share<n>], e.g. digits2_ops2"
        )
    words = {word: op for op, word in _OPERATOR_WORDS.items()}
    operators = "".join(words[w] for w in match["operators"].split("_") if w) or "+"
    optional = {key: int(match[key]) for key in ("seed", "train_size", "test_size", "test_share") if match[key] is not None}
    return dict(digits=int(match["digits"]), operands=int(match["operands"]), operators=operators, **optional)


def _validate(digits: int, operands: int, operators: str, train_size: int, test_size: int,
              test_share: int = DEFAULT_TEST_SHARE) -> None:
    if not 1 <= digits <= 9:
        raise ValueError(f"digits must be in [1, 9], got {digits}")
    if operands < 2:
        raise ValueError(f"operands must be at least 2, got {operands}")
    if not operators or any(op not in _OPERATOR_WORDS for op in operators) or len(set(operators)) != len(operators):
        raise ValueError(f"operators must be distinct characters of '+-*', got {operators!r}")
    if train_size < 0 or test_size < 0:
        raise ValueError(f"split sizes must be >= 0, got train_size={train_size}, test_size={test_size}")
    if test_share < 2:
        raise ValueError(f"test_share must be at least 2 (one question in test_share is held out), got {test_share}")


def evaluate_expression(numbers: list[int], operators: list[str]) -> int:
    """Exact value of ``numbers[0] operators[0] numbers[1] ...`` with ``*`` before ``+``/``-``."""
    terms, signs = [numbers[0]], [1]
    for operator, number in zip(operators, numbers[1:]):
        if operator == "*":
            terms[-1] *= number
        else:
            terms.append(number)
            signs.append(1 if operator == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms))


def hints(expression: str) -> list[str]:
    """Scaf-GRPO's tiers of hints for ``expression`` ("4 + 7 * 9"), most abstract first: the concept (the order of
    operations), the plan (which operation comes first) and, with three operations or more, the steps before the
    last one with their results. No tier states the answer."""
    words = expression.split()
    numbers, operators = [int(w) for w in words[0::2]], words[1::2]
    steps, terms, signs = [], [numbers[0]], ["+"]  # products first, then sums and differences from the left
    for operator, number in zip(operators, numbers[1:]):
        if operator == "*":
            steps.append(f"{terms[-1]} * {number} = {terms[-1] * number}")
            terms[-1] *= number
        else:
            terms.append(number)
            signs.append(operator)
    total = terms[0]
    for sign, term in zip(signs[1:], terms[1:]):
        steps.append(f"{total} {sign} {term} = {total + term if sign == '+' else total - term}")
        total = total + term if sign == "+" else total - term
    order = ", multiplications before additions and subtractions" if "*" in operators else ""
    first = steps[0].split(" = ")[0]
    then = ", then use its result in the next operation." if len(steps) > 1 else "; it is the only operation."
    tiers = [f"Compute one operation at a time, from left to right{order}.", f"Start with {first}{then}"]
    if len(steps) > 1:
        tiers.append(" ".join(s + "." for s in steps[:-1]) + " Now do the last operation.")
    return tiers


def _split_of(expression: str, seed: int, test_share: int = DEFAULT_TEST_SHARE) -> str:
    digest = hashlib.blake2b(f"{seed}:{expression}".encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "little") % test_share == 0 else "train"


def generate_example(config: ArithmeticConfig, split: str, index: int) -> dict:
    """Example ``index`` of ``split``: a pure function of (config, split, index)."""
    rng = np.random.default_rng([config.seed, _SPLIT_IDS[split], index])
    low = 0 if config.digits == 1 else 10 ** (config.digits - 1)
    for _ in range(_MAX_TRIES_PER_EXAMPLE):
        numbers = [int(n) for n in rng.integers(low, 10**config.digits, size=config.operands)]
        operators = [config.operators[i] for i in rng.integers(0, len(config.operators), size=config.operands - 1)]
        expression = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(operators, numbers[1:])])
        if _split_of(expression, config.seed, config.test_share) == split:
            return {
                "question": f"What is {expression}?",
                "answer": str(evaluate_expression(numbers, operators)),
                "expression": expression,
            }
    raise RuntimeError(f"no {split} question found for {config.name} after {_MAX_TRIES_PER_EXAMPLE} draws")


def generate_split(config: ArithmeticConfig, split: str) -> list[dict]:
    """All examples of a split, in index order."""
    size = config.train_size if split == "train" else config.test_size
    return [generate_example(config, split, i) for i in range(size)]


class Arithmetic(tfds.core.GeneratorBasedBuilder):
    """TFDS builder of the procedural arithmetic task (no download, no manual data)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIGS = [
        ArithmeticConfig(name=config_name(d, n, ops, 0, DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE), digits=d, operands=n, operators=ops)
        for d, n, ops in [(1, 2, "+"), (2, 2, "+"), (3, 2, "+"), (1, 3, "+"), (2, 3, "+"), (2, 2, "+-"), (2, 3, "+-*")]
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__.split("\n\n")[0],
            features=tfds.features.FeaturesDict(
                {"question": tfds.features.Text(), "answer": tfds.features.Text(), "expression": tfds.features.Text()}
            ),
            supervised_keys=("question", "answer"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Generated, nothing to download.
        return {split: self._generate_examples(split) for split in _SPLIT_IDS}

    def _generate_examples(self, split: str):
        for index, example in enumerate(generate_split(self.builder_config, split)):
            yield index, example


def arithmetic_config(
    digits: int = 2,
    operands: int = 2,
    operators: str = "+",
    seed: int = 0,
    train_size: int = DEFAULT_TRAIN_SIZE,
    test_size: int = DEFAULT_TEST_SIZE,
    test_share: int = DEFAULT_TEST_SHARE,
) -> ArithmeticConfig:
    """The builder config of a difficulty and size: a predefined one if it exists, else a new one."""
    _validate(digits, operands, operators, train_size, test_size, test_share)
    name = config_name(digits, operands, operators, seed, train_size, test_size, test_share)
    if name in Arithmetic.builder_configs:
        return Arithmetic.builder_configs[name]
    return ArithmeticConfig(
        name=name,
        digits=digits,
        operands=operands,
        operators=operators,
        seed=seed,
        train_size=train_size,
        test_size=test_size,
        test_share=test_share,
        description=f"{digits}-digit operands, {operands} operands, operators {operators!r}, seed {seed}",
    )
