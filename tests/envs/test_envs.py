"""Environments: the registry, tool calls and the calculator, the tool environment and the number game."""

import pytest

from jaxgrpo.envs import Step, environment_names, make_environment, register_environment
from jaxgrpo.envs.games import GuessNumber
from jaxgrpo.envs.tools import ToolCall, evaluate_arithmetic, numeric_answer_matches, parse_tool_calls


def test_the_registry_makes_built_ins_and_refuses_unknown_or_taken_names():
    assert {"calculator", "guess_number"} <= set(environment_names())
    assert isinstance(make_environment("guess_number", max_guesses=3), GuessNumber)
    with pytest.raises(ValueError, match="unknown environment 'chess'; registered: .*calculator"):
        make_environment("chess")
    with pytest.raises(ValueError, match="registered already"):
        register_environment("calculator", GuessNumber)


def test_tool_calls_parse_in_order_and_malformed_ones_say_why():
    text = ('First <tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call> then '
            '<tool_call>{"name": "calculator", "arguments": {bad}}</tool_call> and <tool_call>[1]</tool_call> '
            '<tool_call>{"name": "x", "arguments": 3}</tool_call> <tool_call>{"name": "calculator"')
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2 + 3"})
    assert "not JSON" in calls[1].error and "JSON object" in calls[2].error and "arguments" in calls[3].error
    assert "not closed" in calls[4].error and len(calls) == 5
    assert parse_tool_calls("no call here") == []


@pytest.mark.parametrize("expression, value", [("123 * 456", 56088), ("-(2 + 3) ** 2", -25), ("7 // 2 + 7 % 2", 4),
                                               ("1 / 4", 0.25)])
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os').system('ls')", "only numbers"), ("x + 1", "only numbers"), ("9 ** 9 ** 9", "too large"),
    ("1 / 0", "division by zero"), ("2 +", "does not parse"), ("1" * 300, "at most 200")])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, reason):
    with pytest.raises(ValueError, match=reason):
        evaluate_arithmetic(expression)


def test_the_calculator_environment_answers_calls_and_scores_the_final_answer():
    env = make_environment("calculator", max_calls=2)
    messages = env.reset({"question": "What is 123 * 456?", "answer": "56088"})
    assert messages[0]["role"] == "system" and "calculator" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "What is 123 * 456?"}
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>')
    assert step == Step([{"role": "tool", "content": "56088"}], 0.0, False, {"tool_calls": 1, "tool_errors": 0})
    step = env.step('<tool_call>{"name": "abacus", "arguments": {}}</tool_call>')
    assert "error: no tool named 'abacus'" in step.observation[0]["content"] and step.info["tool_errors"] == 1
    assert env.step("The answer is 56,088.") == Step(None, 1.0, True, {"correct": True, "tool_calls": 2})
    env.reset({"question": "q", "answer": "5"})
    assert env.step("It is 6").reward == 0.0
    env.reset({"question": "q", "answer": "5"})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    env.step(call + call)
    assert env.step(call).info["too_many_calls"]
    assert numeric_answer_matches("x = 1,234.0", {"answer": "1234"}) and not numeric_answer_matches("none", {"answer": 1})


def test_guess_number_gives_feedback_and_ends_on_the_secret_or_the_budget():
    env = GuessNumber(max_guesses=3)
    assert "from 1 to 10" in env.reset({"secret": 7, "low": 1, "high": 10})[0]["content"]
    assert env.step("5").observation[0]["content"].startswith("Higher.")
    assert env.step("I think 9").observation[0]["content"].startswith("Lower.")
    assert env.step("7") == Step(None, 1.0, True, {"guesses": 3, "solved": True})
    env.reset({"secret": 2, "low": 1, "high": 10})
    assert env.step("no idea").observation[0]["content"].startswith("That is not a number.")
    env.step("3")
    assert env.step("4") == Step(None, 0.0, True, {"guesses": 3, "solved": False})
    with pytest.raises(ValueError, match="outside"):
        env.reset({"secret": 20, "low": 1, "high": 10})


def test_the_guess_number_task_gives_seeded_secrets_the_environment_reads():
    from jaxgrpo.data import get_task
    from jaxgrpo.data.games import guess_correct

    task = get_task("guess_number", max_number=10)
    train, test = task.load("train", num_examples=50), task.load("test", num_examples=50)
    assert train == task.load("train", num_examples=50) and train != test
    assert all(1 <= e["secret"] <= 10 and (e["low"], e["high"]) == (1, 10) for e in train + test)
    env = GuessNumber()
    env.reset(train[0])
    assert env.step(str(train[0]["secret"])).reward == 1.0
    assert guess_correct(["It is 3", "no", f"maybe {train[0]['secret']}"], [{"secret": 4}, {"secret": 4}, train[0]]).tolist() \
        == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="no configs"):
        get_task("guess_number/hard")
