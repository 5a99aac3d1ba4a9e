"""Scaf-GRPO's scaffolding (`Config.guidance`, jaxgrpo.train.guidance): an all-wrong group's first sample is
replaced by the first correct completion sampled with a hint in the prompt, tier by tier, and trains on-policy."""

import os
from typing import NamedTuple

import jax
import numpy as np
import pytest

from jaxgrpo.config import ConfigError, apply_overrides, load_experiment, validate
from jaxgrpo.data import arithmetic
from jaxgrpo.data.toy import ToySumTask
from jaxgrpo.train import Trainer, guidance
from jaxgrpo.train.batch import packed_trees
from jaxgrpo.train.rollout import Trajectories
from tests.support import experiment_metrics
from tests.support.paths import REPO_ROOT
from tests.support.updates import host_params, packed_and_padded

ROOT = REPO_ROOT


def test_arithmetic_hints_go_from_the_concept_to_the_steps_without_the_answer():
    tiers = arithmetic.hints("2 + 3 * 4 - 1")
    assert tiers == ["Compute one operation at a time, from left to right, multiplications before additions and "
                     "subtractions.", "Start with 3 * 4, then use its result in the next operation.",
                     "3 * 4 = 12. 2 + 12 = 14. Now do the last operation."]
    assert not any("= 13" in t for t in tiers)  # 2 + 12 - 1 = 13 is left to the policy
    assert arithmetic.hints("4 + 7") == ["Compute one operation at a time, from left to right.",
                                         "Start with 4 + 7; it is the only operation."]


class Generated(NamedTuple):
    """A stand-in `sampler.Generation` (a pytree, as the sampler's)."""

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    completion_tokens: np.ndarray
    completion_mask: np.ndarray


def Out(rows, width, marker) -> Generated:
    """`rows` rows whose prompts are `width` tokens of `marker`."""
    return Generated(np.full((rows, width), marker, np.int32), np.ones((rows, width), bool),
                     np.full((rows, 3), marker, np.int32), np.ones((rows, 3), bool))


def _rollout(out, examples, correct) -> Trajectories:
    n = len(examples)
    return Trajectories(out.prompt_tokens, out.prompt_mask, out.completion_tokens, out.completion_mask.astype(np.float32),
                   np.full((n, 3), -1.0, np.float32), np.ones(n, bool), np.asarray(correct, np.float32),
                   {"right": np.asarray(correct, np.float32)}, np.asarray(correct, np.float32), np.ones(n, bool),
                   np.ones(n, bool), np.repeat(np.arange(n // 2), 2).astype(np.int32), [str(c) for c in correct],
                   examples)


def _scripted(width: int):
    """(calls, generate, score): a stand-in sampler whose hinted prompts are `width` tokens of 9, and a scorer for
    which only a prompt hinted "y" is answered right, on every second attempt."""
    calls = []

    def generate(hinted, n, key, ids):
        calls.append(([e["question"] for e in hinted], n, ids.tolist()))
        return Out(len(hinted) * n, width, 9)

    def score(out, originals):
        questions, n, _ = calls[-1]
        return _rollout(out, originals, [float(questions[i // n].endswith("Hint: y") and i % n == 1)
                                         for i in range(len(originals))])

    return calls, generate, score


def test_scaffold_replaces_the_first_sample_of_each_all_wrong_group_with_the_least_hinted_success():
    """Three groups of two: group 0 all wrong (its second tier works), group 1 right once (untouched), group 2 all
    wrong with one tier that never works. Attempts 2: the second attempt is the correct one."""
    cfg = load_experiment(os.path.join(ROOT, "experiments", "toy_sum.py"))
    apply_overrides(cfg, ["group_size=2", "guidance.attempts=2", "packing=false", "correctness_reward=right"])
    examples = [{"question": "a", "hints": ["x", "y"]}] * 2 + [{"question": "b", "hints": ["x"]}] * 2 + \
               [{"question": "c", "hints": ["x"]}] * 2
    rollout = _rollout(Out(6, 4, 7), examples, [0, 0, 1, 0, 0, 0])
    calls, generate, score = _scripted(width=6)
    got, stats = guidance.scaffold(cfg, rollout, jax.random.key(0), generate=generate, score=score,
                                   hints=guidance.task_hints(None), prompt_length=lambda e: 10)
    assert calls == [(["a\nHint: x", "c\nHint: x"], 2, [0, 2]), (["a\nHint: y"], 2, [0])]
    assert guidance.summarize(stats) == {"guidance_failed_groups": 2, "guidance_hinted_samples": 6,
                                         "guidance_solved_groups": 1, "guidance_mean_tier": 2.0}
    assert got.prompt_tokens.shape == (6, 6)  # re-padded on the left to the hinted prompt's width
    assert got.prompt_tokens[0].tolist() == [9] * 6 and got.prompt_mask[1].tolist() == [False] * 2 + [True] * 4
    assert got.correct.tolist() == [1, 0, 1, 0, 0, 0] and got.per_reward["right"][0] == 1
    assert got.examples == examples and got.group_ids.tolist() == rollout.group_ids.tolist()
    # A hint that would make the prompt too long is not tried.
    _, stats = guidance.scaffold(cfg, rollout, jax.random.key(0), generate=generate, score=score,
                                 hints=guidance.task_hints(None), prompt_length=lambda e: 10_000)
    assert guidance.summarize(stats) == {"guidance_failed_groups": 2, "guidance_hints_too_long": 2,
                                         "guidance_solved_groups": 0}


def test_the_mean_tier_is_over_every_rounds_solved_groups():
    # Two sampling rounds summed by `rollout.collect`: 1 group at tier 2, then 3 at tier 1 -> (2 + 3) / 4.
    summed = {"guidance_failed_groups": 5, "guidance_solved_groups": 4, "guidance_solved_tiers": 5}
    assert guidance.summarize(summed) == {"guidance_failed_groups": 5, "guidance_solved_groups": 4,
                                          "guidance_mean_tier": 1.25}


def test_with_replace_group_the_first_hinted_group_with_a_right_sample_replaces_the_whole_group():
    cfg = load_experiment(os.path.join(ROOT, "experiments", "toy_sum.py"))
    apply_overrides(cfg, ["group_size=2", "guidance.replace=group", "correctness_reward=right"])
    validate(cfg)  # packing may stay on: a hinted group shares its prompt
    examples = [{"question": "a", "hints": ["x", "y"]}] * 2 + [{"question": "b", "hints": ["x"]}] * 2
    rollout = _rollout(Out(4, 4, 7), examples, [0, 0, 1, 0])
    calls, generate, score = _scripted(width=5)
    got, stats = guidance.scaffold(cfg, rollout, jax.random.key(0), generate=generate, score=score,
                                   hints=guidance.task_hints(None), prompt_length=lambda e: 10)
    assert calls == [(["a\nHint: x"], 2, [0]), (["a\nHint: y"], 2, [0])]  # G samples per hinted prompt
    summary = guidance.summarize(stats)
    assert summary["guidance_solved_groups"] == 1 and summary["guidance_mean_tier"] == 2.0
    assert got.correct.tolist() == [0, 1, 1, 0] and got.prompt_tokens[:2].tolist() == [[9] * 5] * 2
    assert got.prompt_tokens[2].tolist() == [0] + [7] * 4


class ToyWithHints(ToySumTask):
    def hints(self, example):
        return [f"The last digit of {example['question']}.", f"It is {example['answer']}."]

    def messages(self, example):  # the toy's character tokenizer has no capitals
        return [{"role": "user", "content": example["question"].lower()}]


def test_a_guided_step_trains_the_hinted_samples_on_policy(tmp_path):
    """The step's samples are scored all wrong, the hinted ones right (a scripted reward): each group's first row
    is then its hinted sample, whose log-probs the trainer recomputes with the hint in the prompt."""
    calls = []

    def scripted(completions, examples):
        calls.append(len(completions))
        return np.full(len(completions), float(len(calls) > 1), np.float32)

    cfg = load_experiment(os.path.join(ROOT, "experiments", "toy_sum.py"))
    overrides, _ = experiment_metrics.tiny_overrides(cfg, tmp_path / "run")
    apply_overrides(cfg, overrides + ["correctness_reward=scripted", "guidance.attempts=1", "prompts_per_step=4",
                                      "group_size=2"])
    trainer = Trainer(cfg, reward_fns=[(scripted, 1.0)], task=ToyWithHints())
    assert trainer.cfg.packing  # on a CPU the default packs
    rollout, _, timings = trainer.rollout(trainer.loop_state, jax.random.key(3))
    assert timings["guidance_failed_groups"] == 4 and timings["guidance_solved_groups"] == 4
    assert timings["guidance_mean_tier"] == 1.0 and calls == [8, 4]
    prompts = [trainer.tokenizer.decode(t[m].tolist()) for t, m in zip(rollout.prompt_tokens, rollout.prompt_mask)]
    assert ["hint: the last digit of" in p for p in prompts] == [True, False] * 4
    assert rollout.correct.tolist() == [1.0, 0.0] * 4
    batch = trainer.advantages(trainer.loop_state, rollout)
    mask = np.asarray(batch.completion_mask) > 0
    assert (np.asarray(batch.advantages)[0::2][mask[0::2]] > 0).all()
    new = trainer.logprobs(trainer.state.params, batch.tokens, batch.attention_mask, batch.positions, mask.shape[1])
    np.testing.assert_allclose(np.asarray(new)[mask], np.asarray(batch.old_logp)[mask], atol=1e-5, rtol=0)
    # A hinted row's prompt is not its group's: each row packs as a tree of its own, and updates as padded rows do.
    assert packed_trees(trainer.cfg, batch).size == 1
    (packed, _), (padded, _) = packed_and_padded(trainer, jax.tree.map(np.array, trainer.loop_state.train), batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4), *host_params(packed, padded))
    _, metrics = trainer.learn(trainer.loop_state, batch, rollout)
    assert np.isfinite(metrics["loss"])


@pytest.mark.parametrize("overrides, message", [
    (["guidance.attempts=0"], "guidance.attempts must be >= 1"),
    (["guidance.after_step=-1"], "guidance.after_step must be >= 0"),
    (["guidance.attempts=1", "environment.name=calculator"], "drop one of guidance and environment"),
    (["guidance.replace=all"], "guidance.replace must be 'one' .Scaf-GRPO. or 'group' .GHPO."),
])
def test_bad_guidance_settings_are_one_line_errors(overrides, message):
    cfg = load_experiment(os.path.join(ROOT, "experiments", "toy_sum.py"))
    apply_overrides(cfg, overrides)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_a_task_without_hints_is_refused_before_the_model_is_built():
    with pytest.raises(ConfigError, match="task 'toy_sum' defines no hints"):
        guidance.check(ToySumTask(), ToySumTask().load("train"), num_processes=1)
    with pytest.raises(ConfigError, match="in one process for now"):
        guidance.check(ToyWithHints(), [], num_processes=2)
