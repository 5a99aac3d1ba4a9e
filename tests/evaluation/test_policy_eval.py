"""`policy_eval.evaluate_policy` on scripted completions: greedy accuracy, the format-only share and pass@k
against hand-counted values, with a stand-in for the trainer (its generate, tokenizer, reward_fns)."""

import types

import numpy as np
import pytest

from jaxgrpo import rewards
from jaxgrpo.config import Config
from jaxgrpo.evaluation import policy_eval
from jaxgrpo.train import evaluation

EXAMPLES = [{"question": f"What is {a}?", "answer": str(a)} for a in (3, 5, 7, 9)]
GREEDY = ["The answer is 3.", "The answer is 4.", "The answer is 7.", "I do not know."]
# 4 samples per question: 2, 0, 4 and 1 correct
SAMPLES = [["The answer is 3.", "The answer is 3.", "The answer is 1.", "x"],
           ["The answer is 1."] * 4,
           ["The answer is 7."] * 4,
           ["The answer is 9.", "no", "no", "no"]]


class ScriptedTrainer:
    """Answers every prompt with the scripted completions; completion token i decodes to text i."""

    def __init__(self):
        self.cfg = Config()
        self.texts = []
        self.reward_fns = [(rewards.correctness_reward, 1.0), (rewards.format_reward, 0.1)]
        self.tokenizer = types.SimpleNamespace(
            batch_decode=lambda rows, skip_special_tokens=True: [self.texts[int(r[0])] for r in rows],
            encode=lambda text: list(text))

    def generate(self, examples, num_samples, key, greedy=False):
        texts = GREEDY if greedy else [t for row in SAMPLES for t in row[:num_samples]]
        start = len(self.texts)
        self.texts.extend(texts)
        return types.SimpleNamespace(completion_tokens=np.arange(start, start + len(texts))[:, None],
                                     completion_mask=np.ones((len(texts), 1), bool))


def test_figures_equal_hand_counts():
    result = policy_eval.evaluate_policy(ScriptedTrainer(), EXAMPLES, [1, 2, 4])
    m = result.metrics
    assert m["greedy_accuracy"].value == 0.5
    assert m["greedy_well_formed"].value == 0.75  # three state "The answer is N."
    assert m["greedy_format_only"].value == 0.25  # of which one is wrong
    assert m["pass@1"].value == pytest.approx((2 / 4 + 0 + 1 + 1 / 4) / 4)
    # pass@2 = 1 - C(n - c, 2) / C(4, 2): 1 - 1/6, 0, 1, 1 - 3/6
    assert m["pass@2"].value == pytest.approx((5 / 6 + 0 + 1 + 1 / 2) / 4)
    assert m["pass@4"].value == 0.75
    for interval in m.values():
        assert interval.low <= interval.value <= interval.high
    assert result.records[1] == {"index": 1, "question": "What is 5?", "answer": "5", "greedy": "The answer is 4.",
                                 "greedy_correct": False, "greedy_well_formed": True, "samples": SAMPLES[1],
                                 "samples_correct": [False] * 4}


def test_the_trainers_evaluation_reports_the_same_shares():
    # The evaluation a training run logs (eval.jsonl) counts the well-formed and format-only answers as
    # jaxgrpo-eval does: the same scripted answers give the same hand counts.
    trainer = ScriptedTrainer()
    trainer.cfg.eval_pass_k = 4
    m = evaluation.evaluate(trainer.cfg, trainer.generate, trainer.tokenizer, trainer.reward_fns, EXAMPLES, step=0)
    assert m == pytest.approx({"greedy_accuracy": 0.5, "greedy_well_formed": 0.75, "greedy_format_only": 0.25,
                               "pass@1": (2 / 4 + 0 + 1 + 1 / 4) / 4, "pass@4": 0.75})
    trainer.reward_fns = trainer.reward_fns[:1]  # no format reward: no format shares
    assert "greedy_format_only" not in evaluation.evaluate(trainer.cfg, trainer.generate, trainer.tokenizer,
                                                           trainer.reward_fns, EXAMPLES, step=0)
