"""Tool use: tool calls in the Hermes / Qwen format, a calculator, and an environment that runs the tools.

A policy calls a tool by writing, anywhere in its turn,

    <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>

(the format of Qwen2.5 / Qwen3's chat templates and of Hermes; the system message lists the tools for models
whose template has no tools block, such as SmolLM2's). `ToolEnvironment` answers every call of a turn with one
"tool" message holding the results in order; a turn without a call is the final answer, which the
environment's `check(answer, example)` scores. A malformed call (not JSON, an unknown tool, wrong arguments)
gets an error message as its result, and the episode goes on.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Callable, Mapping, NamedTuple

from jaxgrpo.envs.base import Message, Step

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class ToolCall(NamedTuple):
    """A parsed call: the tool's name and arguments, or `error` (a one-line reason) when it is malformed."""

    name: str | None
    arguments: dict
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>{json}</tool_call>` in `text`, in order (an unclosed `<tool_call>` is a malformed call)."""
    calls = []
    for body in _CALL.findall(text):
        try:
            payload = json.loads(body)
        except ValueError as error:
            calls.append(ToolCall(None, {}, f"the tool call is not JSON ({error.msg})"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall(None, {}, 'a tool call is a JSON object {"name": ..., "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], {}, "a tool call's arguments are a JSON object"))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    if text.count("<tool_call>") > len(calls):
        calls.append(ToolCall(None, {}, "a <tool_call> is not closed by </tool_call>"))
    return calls


class Tool(NamedTuple):
    """A function the policy may call: `run(**arguments) -> str`, described to it by `description`."""

    name: str
    description: str
    run: Callable[..., str]


# -- the calculator -------------------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_MAGNITUDE = 10 ** 30  # a result (or power operand) beyond it is refused: no 9 ** 9 ** 9 on the host


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression of numbers, + - * / // % ** and parentheses; ValueError otherwise."""
    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("the expression must be a string of at most 200 characters")

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10 ** 6):
                raise ValueError("the power is too large")
            result = _BINARY[type(node.op)](left, right)
            if abs(result) > _MAX_MAGNITUDE:
                raise ValueError("the result is too large")
            return result
        raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("the expression does not parse") from None
    try:
        return value(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def _calculator(expression: str) -> str:
    result = evaluate_arithmetic(expression)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


CALCULATOR = Tool("calculator", 'Evaluates arithmetic. Arguments: {"expression": "12 * (3 + 4)"}.', _calculator)


# -- the environment ------------------------------------------------------------------------------------------

def _final_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return numbers[-1].replace(",", "") if numbers else None


def numeric_answer_matches(answer: str, example: Mapping[str, Any]) -> bool:
    """The last number of the final answer equals the example's "answer"."""
    found = _final_number(answer)
    try:
        return found is not None and float(found) == float(str(example["answer"]).replace(",", ""))
    except ValueError:
        return False


class ToolEnvironment:
    """Answers tool calls with their results; scores the first turn without one (see the module docstring).

    Args:
      tools: the tools the policy may call.
      check: (final answer text, example) -> whether it is right (reward `correct_reward`, else 0).
      system: the system message's opening; the tools' descriptions and the call format follow it.
      max_calls: tool calls allowed per episode; a turn beyond them ends the episode unanswered (reward 0).
      demonstrate: example -> the policy turns of a correct episode (`demonstration`, the supervised warm-up's),
        or None when the tools have no demonstration.
    """

    failure_reward = 0.0
    observation_roles = ("tool",)  # tool results come back in "tool" messages

    def __init__(self, tools: list[Tool], check: Callable[[str, Any], bool] = numeric_answer_matches, *,
                 system: str = "You are a helpful assistant that can use tools.", max_calls: int = 4,
                 correct_reward: float = 1.0, demonstrate: Callable[[Any], list[str]] | None = None):
        self.tools = {tool.name: tool for tool in tools}
        self._demonstrate = demonstrate
        self.check, self.max_calls, self.correct_reward = check, int(max_calls), float(correct_reward)
        listing = "\n".join(f"- {tool.name}: {tool.description}" for tool in tools)
        self.system = (f"{system}\nTools:\n{listing}\nTo call one, write <tool_call>{{\"name\": ..., \"arguments\": "
                       f"{{...}}}}</tool_call>; its result comes back in a tool message. Give the final answer "
                       f"without a tool call.")
        self.example, self.calls = None, 0

    def reset(self, example: Mapping[str, Any]) -> list[Message]:
        self.example, self.calls = example, 0
        return [{"role": "system", "content": self.system}, {"role": "user", "content": str(example["question"])}]

    def demonstration(self, example: Mapping[str, Any]) -> list[str] | None:
        """The policy turns of a correct episode of `example`, or None without a demonstration."""
        return None if self._demonstrate is None else self._demonstrate(example)

    def step(self, action: str) -> Step:
        calls = parse_tool_calls(action)
        if not calls:
            correct = bool(self.check(action, self.example))
            return Step(None, self.correct_reward if correct else 0.0, True, {"correct": correct, "tool_calls": self.calls})
        self.calls += len(calls)
        if self.calls > self.max_calls:
            return Step(None, 0.0, True, {"correct": False, "tool_calls": self.calls, "too_many_calls": True})
        results = [self._run(call) for call in calls]
        errors = sum(r.startswith("error:") for r in results)
        return Step([{"role": "tool", "content": "\n".join(results)}], 0.0, False,
                    {"tool_calls": self.calls, "tool_errors": errors})

    def _run(self, call: ToolCall) -> str:
        if call.error:
            return f"error: {call.error}"
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: no tool named {call.name!r}; tools: {', '.join(self.tools)}"
        try:
            return tool.run(**call.arguments)
        except TypeError as error:
            return f"error: wrong arguments for {call.name}: {error}"
        except ValueError as error:
            return f"error: {error}"


def tool_call(name: str, **arguments) -> str:
    """A call of tool `name` as the policy writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def calculator_demonstration(example: Mapping[str, Any]) -> list[str]:
    """A correct calculator episode: the call on the example's "expression" (or the question's "What is X?"),
    then the answer, the example's "answer"."""
    expression = example.get("expression")
    if expression is None:
        found = re.search(r"what is (.+?)\?*$", str(example["question"]).strip(), re.I)
        if found is None:
            raise ValueError(f"no expression to demonstrate in the question {example['question']!r}: give the "
                             "example an 'expression'")
        expression = found.group(1)
    return [tool_call("calculator", expression=str(expression)), f"The answer is {example['answer']}."]


def calculator_environment(**kwargs) -> ToolEnvironment:
    """A `ToolEnvironment` with the calculator and its demonstration; examples have "question" and "answer"."""
    return ToolEnvironment([CALCULATOR], demonstrate=calculator_demonstration, **kwargs)
