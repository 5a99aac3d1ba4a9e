"""Final-answer extraction and numeric equivalence for math completions.

A completion is judged by its *final answer*, found in this order of
precedence (the last occurrence of the first kind present wins):

1. ``\\boxed{...}`` (balanced braces, as in the MATH / DeepSeek-R1 convention);
2. an answer statement: "the answer is X", "Answer: X", "#### X" (GSM8K);
3. otherwise the last number in the text.

Answers are compared as exact rationals (``fractions.Fraction``), after
normalizing the ways a model writes the same number: thousands separators
("1,234"), currency and units ("$18", "18 dollars", "5 cm"), trailing periods,
percent signs, decimals ("0.50" == "1/2"), LaTeX fractions (``\\frac{1}{2}``),
unicode minus signs and signed fractions ("3/4", "-(1/2)"). An answer is a *number*: a sum,
difference or product ("4 + 7 + 9") is not one, so restating the question's arithmetic unevaluated
does not answer it (a policy trained on an arithmetic task finds that shortcut within a few steps).
Parsing is a small whitelist of the ``ast`` of an expression, never ``eval``.
Answers that are not numbers are compared as normalized strings.

The reward functions here follow the signature shared by every reward in
``jaxgrpo.rewards``::

    reward_fn(completions: list[str], examples: Sequence[dict], **context) -> np.ndarray  # f32[N]

where ``examples[i]`` is the task example completion ``i`` answers (a dict with
at least ``"answer"``, the exact final answer as a string).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

# Hyphen-like characters models emit in place of an ASCII minus.
MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2012": "-"})

# A number as written in prose: optional sign and "$", digits with optional
# thousands separators, optional decimals, optional "/denominator".
NUMBER_PATTERN = r"(?:-\s?)?\$?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:\s?/\s?\d+(?:\.\d+)?)?"
_NUMBER_RE = re.compile(NUMBER_PATTERN)

# "The final answer is X", "answer: X", "#### X"; X runs to the end of the line
# or to the next such statement.
_STATEMENT_MARKER = r"(?:answer\s*(?:is|=|:)|####)"
_STATEMENT_RE = re.compile(
    _STATEMENT_MARKER + r"\s*:?\s*(?P<value>(?:(?!" + _STATEMENT_MARKER + r")[^\n])*)",
    flags=re.IGNORECASE,
)

# Longer text is prose, not a number; the bounds also keep the regexes and ast cheap.
_MAX_ANSWER_CHARS = 256
_MAX_EXPRESSION_CHARS = 64

_LATEX_FRACTION_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_NOISE_RE = re.compile(r"\\(?:left|right|,|!|;|:|\s)|\^\{?\\circ\}?")
_LATEX_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")


def _strip_latex(text: str) -> str:
    """Unwraps ``\\text{...}``-like macros and drops LaTeX spacing and degree marks."""
    return _LATEX_NOISE_RE.sub("", _LATEX_TEXT_RE.sub(r"\1", text))


def last_boxed(text: str) -> str | None:
    """Returns the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_brace = text.find("{", start)
    if open_brace < 0:
        return None
    depth = 0
    for position in range(open_brace, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : position]
    return None


def extract_final_answer(text: str) -> str | None:
    """Returns the final answer of a completion as a string, or None if it states none.

    See the module docstring for the order of precedence. For an answer
    statement, the value is the rest of the line when it reads as a number
    ("The answer is $1,234 dollars." -> "$1,234 dollars"), else the first
    number in it ("The answer is 45, since 3*15=45" -> "45"), else the rest of
    the line as text. A statement with "=" states the last side that is a
    number: "The answer is 5 - 3 = 2." states 2, "The answer is 20 = 4 + 7 + 9." 20.
    """
    text = text.translate(MINUS_SIGNS)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    statements = list(_STATEMENT_RE.finditer(text))
    for statement in reversed(statements):
        value = statement.group("value")
        number = stated_number(value)
        if number is not None:
            return number
        value = value.rsplit("=", 1)[-1].strip()
        number = _NUMBER_RE.search(value)
        if number is not None:
            return number.group(0)
        if value:
            return value.rstrip(".").strip()
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def stated_number(value: str) -> str | None:
    """The number an answer statement's value states, or None: the value itself ("$18.") or, when it
    holds "=", its last side that is a number ("5 - 3 = 2." -> "2.", "20 = 4 + 7 + 9" -> "20")."""
    sides = [side.strip() for side in value.split("=")]
    return next((side for side in reversed(sides) if parse_number(side) is not None), None)


def _strip_decorations(answer: str) -> str:
    """Removes what does not change a number's value: $, commas, units, LaTeX spacing."""
    answer = _strip_latex(answer.translate(MINUS_SIGNS)).strip()
    answer = _LATEX_FRACTION_RE.sub(r"(\1)/(\2)", answer)
    answer = answer.replace("\\$", "").replace("$", "").replace("%", "")
    answer = re.sub(r"(?<=\d),(?=\d{3}\b)", "", answer)
    answer = answer.rstrip(".").strip()
    # Trailing units or words ("18 dollars", "5 cm", "12 eggs per day").
    answer = re.sub(r"(?<=[\d)])\s*[A-Za-z][A-Za-z\s.]*$", "", answer)
    return answer.strip()


def _rational(node: ast.AST, source: str, *, fraction_part: bool = False) -> Fraction:
    """The exact value of a number written as a whitelisted ``ast`` node of ``source``.

    A number is a literal, a signed number, or a fraction of two signed literals ("3/4", "-(1/2)",
    "(3)/(4)" from ``\\frac``); sums, differences and products are not numbers but unevaluated
    arithmetic. Decimal literals are read from their source text, so "0.1" is 1/10 and not the
    nearest binary float.
    """
    if isinstance(node, ast.Expression):
        return _rational(node.body, source)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(ast.get_source_segment(source, node))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _rational(node.operand, source, fraction_part=fraction_part)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and not fraction_part:
        numerator = _rational(node.left, source, fraction_part=True)
        return numerator / _rational(node.right, source, fraction_part=True)
    raise ValueError(f"not a number: {source!r}")


def parse_number(answer: str | None) -> Fraction | None:
    """Parses a written answer into an exact rational, or None if it is not a number.

    >>> parse_number("$1,234.50.")
    Fraction(2469, 2)
    >>> parse_number("\\\\frac{3}{4}") == parse_number("0.75")
    True
    """
    if answer is None or len(answer) > _MAX_ANSWER_CHARS:
        return None
    expression = _strip_decorations(answer)
    if not expression or len(expression) > _MAX_EXPRESSION_CHARS:
        return None
    try:
        return _rational(ast.parse(expression, mode="eval"), expression)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _normalized_text(answer: str) -> str:
    """A non-numeric answer reduced for string comparison: case, spaces, LaTeX spacing."""
    answer = _strip_latex(answer.translate(MINUS_SIGNS))
    return re.sub(r"\s+", "", answer).rstrip(".").lower()


def answers_equivalent(predicted: str | None, gold: str) -> bool:
    """Whether a predicted final answer equals the gold one.

    Numbers are compared exactly as rationals ("1,234.0" == "1234", "0.5" ==
    "\\frac{1}{2}"); anything else as a normalized string.
    """
    if predicted is None:
        return False
    gold_value = parse_number(gold)
    if gold_value is not None:
        return parse_number(predicted) == gold_value
    return _normalized_text(predicted) == _normalized_text(gold)


def check_batch(completions: Sequence[str], examples: Sequence[dict]) -> None:
    """Raises unless there is exactly one example per completion."""
    if len(completions) != len(examples):
        raise ValueError(
            f"completions has {len(completions)} entries but examples has {len(examples)}; "
            "pass one example per completion (repeat each example G times for a group of G)"
        )


def correctness_reward(completions: Sequence[str], examples: Sequence[dict], **unused_context) -> np.ndarray:
    """1.0 where the completion's final answer equals ``example["answer"]``, else 0.0.

    The verifiable outcome reward of RLVR (as in DeepSeekMath's GRPO, Shao et
    al. 2024, and DeepSeek-R1, 2025): the final answer is extracted with
    `extract_final_answer` and compared with `answers_equivalent`.

    Returns:
      f32[N], one reward per completion.
    """
    check_batch(completions, examples)
    return np.array(
        [answers_equivalent(extract_final_answer(c), str(e["answer"])) for c, e in zip(completions, examples)],
        dtype=np.float32,
    )
