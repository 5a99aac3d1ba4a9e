"""Multi-turn rollouts in token space (`jaxgrpo.engine.multi_turn`) with SmolLM2's real tokenizer and chat template.

The policy is a small random decoder over SmolLM2's vocabulary, so its turns are random tokens: decoding them
and encoding the text again changes them (the re-tokenization drift of history-as-text multi-turn code), which
makes the case for token space. The trajectories must hold exactly the tokens sampled and the observations
appended, and a trainer's forward over them must give the behaviour log-probs.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.engine import Engine
from jaxgrpo.engine.multi_turn import ChatTurns, rollout
from jaxgrpo.envs import Step
from jaxgrpo.models import Decoder, DecoderConfig, registry
from jaxgrpo.models.tokenizer import load_tokenizer
from jaxgrpo.sampler import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(registry.smollm2_135m_instruct())


@pytest.fixture(scope="module")
def policy(tokenizer):
    config = DecoderConfig(family="llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                           num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
    return Decoder(config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(policy):
    return Engine(policy, num_slots=6, max_context=256, block_size=16, decode_chunk=8, key=jax.random.key(0))


class Echo:
    """Answers every turn with a user message naming the turn; done after `turns` turns, reward 1 each."""

    failure_reward = -1.0

    def __init__(self, turns=3, fail_on=None, sleep_on=None):
        self.turns, self.fail_on, self.sleep_on = turns, fail_on, sleep_on
        self.actions = []

    def reset(self, example):
        self.actions = []
        return [{"role": "user", "content": f"Example {example}: say something."}]

    def step(self, action):
        self.actions.append(action)
        turn = len(self.actions)
        if turn == self.fail_on:
            raise RuntimeError("the environment broke")
        if turn == self.sleep_on:
            time.sleep(2.0)
        if turn >= self.turns:
            return Step(None, 1.0, True, {"turn": turn})
        return Step([{"role": "user", "content": f"Turn {turn} heard. Go on."}], 1.0, False, {"turn": turn})


def test_chat_turns_encode_each_observation_alone_as_the_template_continues(tokenizer):
    turns = ChatTurns(tokenizer)
    assert turns.stop_token == tokenizer.eos_token_id and turns.stop_text == "<|im_end|>"
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    observation = [{"role": "tool", "content": "42"}]
    whole = tokenizer.apply_chat_template(history + observation, add_generation_prompt=True, tokenize=False)
    opening = turns.opening(history[:1])
    sampled = turns.encode("Hello") + [turns.stop_token]
    # A turn that stopped: the template's continuation after the stop token; concatenated, the conversation.
    assert opening + sampled + turns.observation(observation) == turns.encode(whole)
    # A turn cut by its budget gets the turn's end marker first.
    cut = turns.observation(observation, stopped=False)
    assert cut[0] == turns.stop_token and cut[1:] == turns.observation(observation)
    assert turns.text(sampled) == "Hello"


def test_trajectories_are_token_exact_and_their_log_probs_are_the_behaviour_ones(engine, policy, tokenizer):
    turns = ChatTurns(tokenizer)
    trajectories, stats = rollout(engine, turns, lambda: Echo(turns=3), [0, 1], group_size=3, max_turns=4,
                                  turn_tokens=12, sampling=SamplingParams(temperature=1.0), key=jax.random.key(3))
    assert [(t.example, t.sample) for t in trajectories] == [(e, s) for e in range(2) for s in range(3)]
    assert stats["episodes"] == 6 and stats["turns"] == 18 and engine.blocks_in_use == 0
    drifted = stops = 0
    worst = 0.0
    for t in trajectories:
        assert t.finish == "done" and t.turn_rewards == [1.0, 1.0, 1.0] and t.reward == 3.0
        assert [i["turn"] for i in t.info] == [1, 2, 3]
        # Policy turns and observations alternate; the observations are exactly their own encodings.
        mask, turn_ids = t.loss_mask, t.turns
        policy_runs = [turn_ids[mask] == k for k in range(3)]
        assert all(run.any() for run in policy_runs) and set(turn_ids.tolist()) == {0, 1, 2}
        for k in range(2):
            observed = t.tokens[(turn_ids == k) & ~mask]
            stopped = t.tokens[(turn_ids == k) & mask][-1] == turns.stop_token
            want = turns.observation([{"role": "user", "content": f"Turn {k + 1} heard. Go on."}], stopped=stopped)
            assert observed.tolist() == want
        assert (t.versions[mask] == engine.version).all() and (t.versions[~mask] == -1).all()
        assert (t.logprobs[~mask] == 0).all() and (t.policy_logprobs[~mask] == 0).all()
        # The trainer's forward over the whole trajectory gives the behaviour log-probs on every policy token.
        sequence = np.concatenate([t.prompt, t.tokens])
        logprobs, _ = policy.token_logprobs(jnp.asarray(sequence[None, :-1]), jnp.asarray(sequence[None, 1:]))
        scored = np.asarray(logprobs[0, len(t.prompt) - 1:])
        np.testing.assert_allclose(scored[mask], t.logprobs[mask], atol=1e-5, rtol=0)
        worst = max(worst, float(np.abs(scored[mask] - t.logprobs[mask]).max()))
        stops += int((t.tokens[mask] == turns.stop_token).sum())
        # Re-tokenizing the decoded history would not give these tokens back.
        text = tokenizer.decode(sequence.tolist(), skip_special_tokens=False)
        drifted += tokenizer.encode(text, add_special_tokens=False) != sequence.tolist()
    assert drifted >= 1
    print(f"largest log-prob difference {worst:.2e}; {drifted} of 6 histories drift when re-tokenized; {stops} stops")


def test_an_environment_that_raises_or_overruns_ends_its_episode_with_the_failure_reward(engine, tokenizer):
    turns = ChatTurns(tokenizer)
    made = iter([Echo(fail_on=2), Echo(sleep_on=1), Echo(turns=2)])
    trajectories, stats = rollout(engine, turns, lambda: next(made), ["x"], group_size=3, max_turns=4,
                                  turn_tokens=6, sampling=SamplingParams(temperature=1.0), step_timeout=0.5)
    broke, slow, fine = trajectories
    assert broke.finish == "error" and broke.turn_rewards == [1.0, -1.0] and "broke" in broke.info[-1]["error"]
    assert slow.finish == "error" and slow.turn_rewards == [-1.0] and "longer than 0.5 s" in slow.info[0]["error"]
    assert fine.finish == "done" and fine.reward == 2.0
    assert stats["environment_errors"] == 2 and engine.blocks_in_use == 0


def test_episodes_end_at_the_turn_budget_and_the_context(engine, tokenizer):
    turns = ChatTurns(tokenizer)
    trajectories, _ = rollout(engine, turns, lambda: Echo(turns=10), [0], group_size=2, max_turns=2, turn_tokens=6,
                              sampling=SamplingParams(temperature=1.0))
    assert all(t.finish == "turns" and len(t.turn_rewards) == 2 for t in trajectories)
    trajectories, stats = rollout(engine, turns, lambda: Echo(turns=100), [0], group_size=2, max_turns=100,
                                  turn_tokens=40, sampling=SamplingParams(temperature=1.0))
    assert all(t.finish == "context" for t in trajectories) and stats["context_ends"] == 2
    assert all(len(t.prompt) + len(t.tokens) <= engine.max_context for t in trajectories)


def test_bad_arguments_are_one_line_errors(engine, tokenizer):
    turns = ChatTurns(tokenizer)
    with pytest.raises(ValueError, match="needs as many engine slots"):
        rollout(engine, turns, Echo, [0], group_size=7, max_turns=1, turn_tokens=4)
    with pytest.raises(ValueError, match=">= 1"):
        rollout(engine, turns, Echo, [0], group_size=1, max_turns=0, turn_tokens=4)
