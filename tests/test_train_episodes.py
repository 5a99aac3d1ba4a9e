"""The trainer on environment episodes (`Config.environment`): multi-turn rows train on the policy's tokens only,
with the behaviour log-probs the trainer recomputes, and held-out episodes are evaluated."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.config import apply_overrides, load_experiment, validate
from jaxgrpo.envs import Step, environment_names, register_environment
from jaxgrpo.errors import ConfigError
from jaxgrpo.metrics import read_jsonl
from jaxgrpo.models import Decoder, DecoderConfig, registry
from jaxgrpo.models.tokenizer import load_tokenizer
from jaxgrpo.train import Trainer, register_model_builder

TOY = os.path.join(os.path.dirname(__file__), "..", "experiments", "toy_sum.py")


class TwoTurns:
    """Answers the first turn with a user message; the second turn ends the episode, rewarded 1 when the policy's
    text has an even length (so a group's episodes differ)."""

    failure_reward = 0.0

    def reset(self, example):
        return [{"role": "user", "content": f"What is {example['question']}?"}]

    def step(self, action):
        if not hasattr(self, "heard"):
            self.heard = True
            return Step([{"role": "user", "content": "Say it again."}], 0.0, False, {})
        return Step(None, float(len(action) % 2 == 0), True, {})


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tokenizer = load_tokenizer(registry.smollm2_135m_instruct())

    def build(dtype=jnp.float32, remat=True):
        config = DecoderConfig(family="llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                               num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
        return Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)), tokenizer

    register_model_builder("random-smollm2-vocab", build)
    if "two_turns" not in environment_names():
        register_environment("two_turns", TwoTurns)
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path_factory.mktemp('episodes') / 'run'}", "model=random-smollm2-vocab",
                          "environment.name=two_turns", "environment.max_turns=3", "environment.max_context=256",
                          "prompts_per_step=2", "group_size=4", "sampling.max_new_tokens=8", "sampling.max_prompt_len=64", "steps=2",
                          "warmup_sft_steps=0", "checkpoint_every=0", "task.num_eval_examples=3", "eval_every=2",
                          "optimizer.lr=1e-3"])
    return Trainer(cfg)


def test_episode_rows_train_on_the_policys_tokens_with_the_behaviour_log_probs(trainer):
    assert trainer.cfg.packing is False  # an episode's observations sit inside its completion
    rollout, timings = trainer.rollout(jax.random.key(5))
    assert rollout.completion_valid is not None and timings["episode_turns"] == 2.0
    batch = trainer.train_batch(rollout)
    prompt_width = rollout.prompt_tokens.shape[1]
    mask = np.asarray(batch.completion_mask) > 0
    attended = np.asarray(batch.attention_mask)[:, prompt_width:]
    observations = attended & ~mask
    assert observations.any(axis=1).all()  # every episode heard "Say it again." after its first turn
    assert (mask <= attended).all() and set(np.unique(rollout.rewards)) <= {0.0, 1.0}
    # The trainer's log-probs of the policy's tokens over whole episodes are the ones the engine sampled with.
    new = trainer.score(batch.tokens, batch.attention_mask, batch.positions, mask.shape[1], "policy")
    np.testing.assert_allclose(np.asarray(new)[mask], np.asarray(batch.old_logp)[mask], atol=1e-5, rtol=0)
    assert np.abs(np.asarray(batch.old_logp)[~mask]).max() == 0


def test_a_run_on_episodes_records_steps_and_held_out_episodes(trainer):
    trainer.run(progress=False)
    records = read_jsonl(os.path.join(trainer.cfg.run_dir, "metrics.jsonl"))
    assert len(records) == 2 and all(np.isfinite(r["loss"]) for r in records)
    assert all(r["episode_turns"] == 2.0 and "reward/environment" in r for r in records)
    evaluations = read_jsonl(os.path.join(trainer.cfg.run_dir, "eval.jsonl"))
    assert [e["step"] for e in evaluations] == [0, 2]
    assert all(0 <= e["greedy_accuracy"] <= 1 and e["greedy_turns"] == 2.0 and "pass@4" in e for e in evaluations)


@pytest.mark.parametrize("overrides, message", [
    (["environment.name=chess"], "environment.name='chess' is not a registered environment"),
    (["environment.name=calculator", "packing=true"], "set packing=false"),
    (["environment.name=calculator", "dynamic_sampling=true"], "dynamic_sampling does not resample"),
    (["environment.name=calculator", "environment.max_context=64"], "cannot hold a prompt"),
    (["environment.name=calculator", "environment.max_turns=0"], "max_turns must be >= 1"),
])
def test_bad_environment_settings_are_one_line_errors(overrides, message):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, overrides)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)
