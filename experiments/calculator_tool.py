"""Tool use: SmolLM2-135M-Instruct with a calculator on 3-digit x 3-digit products, multi-turn GRPO.

Each sample is an episode of the "calculator" environment (`jaxgrpo.envs.tools`): the system message lists the
tool and its call format, the policy may write
`<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>`, reads the result in
a tool message, and answers; the reward is 1 when its final answer's last number is the product. The episodes
run through the rollout engine in token space (`jaxgrpo.engine.multi_turn`: observations are appended to the
sampled tokens, never re-tokenized), and the loss sees only the policy's tokens. Evaluation runs one greedy
episode per held-out question (`greedy_accuracy`, `greedy_turns`).

    jaxgrpo-train experiments/calculator_tool.py

Held-out accuracy with and without the tool, before and after training, is not measured yet (docs/engine.md).
"""

import os

from jaxgrpo.config import Config, EnvironmentConfig, load_experiment

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def config() -> Config:
    c = load_experiment(QUICKSTART)  # its GRPO recipe: advantage, loss, aggregation, batch, learning-rate schedule
    c.task.name = "arithmetic"  # "What is 123 * 456?"; the environment renders the question, not the task
    c.task.kwargs = {"digits": 3, "operands": 2, "operators": "*"}
    c.task.num_eval_examples = 100
    c.environment = EnvironmentConfig(name="calculator", max_turns=3, max_context=640, step_timeout=5.0)
    c.sampling.max_new_tokens = 64  # a tool call of two 3-digit numbers, or an answer, per turn
    c.sampling.max_prompt_len = 256  # the system message with the tool's description and the question
    c.eval_pass_k = 1  # greedy episodes only: pass@k would run k more episodes per question
    c.run_dir = "runs/calculator_tool"
    return c
