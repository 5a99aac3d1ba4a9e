"""The sampler on the real SmolLM2-135M-Instruct: greedy decoding with the cache equals argmax of full
forwards, and under its chat template it answers "What is 2+3?" with 5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxgrpo.models
from jaxgrpo import sampler

QUESTIONS = ["What is 2+3?", "What is the capital of France?", "Name a primary color."]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm():
    return jaxgrpo.models.load("smollm2-135m-instruct")


def test_greedy_generation_equals_argmax_of_full_forwards_and_answers_five(smollm):
    model, tokenizer = smollm
    prompts = sampler.encode_prompts(tokenizer, QUESTIONS)
    stop = sampler.default_stop_tokens(tokenizer)
    rollout = sampler.generate(model, prompts, max_new_tokens=NEW_TOKENS, greedy=True, stop_tokens=stop,
                               pad_id=tokenizer.pad_token_id)

    # Reference: the whole batch right-padded in one buffer, one full forward (no cache) per new token.
    lengths = np.array([len(p) for p in prompts])
    buffer = np.full((len(prompts), int(lengths.max()) + NEW_TOKENS), tokenizer.pad_token_id, np.int32)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    graphdef, state = nnx.split(model)  # weights as arguments, not constants folded into the program
    forward = jax.jit(lambda state, tokens, mask: nnx.merge(graphdef, state)(tokens, attention_mask=mask))
    ends = lengths.copy()
    for _ in range(NEW_TOKENS):
        mask = np.arange(buffer.shape[1])[None] < ends[:, None]
        logits = np.asarray(forward(state, jnp.asarray(buffer), jnp.asarray(mask)))
        buffer[np.arange(len(prompts)), ends] = logits[np.arange(len(prompts)), ends - 1].argmax(-1)
        ends += 1

    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    for row, prompt in enumerate(prompts):
        reference = buffer[row, len(prompt): len(prompt) + NEW_TOKENS]
        length = int(mask[row].sum())
        np.testing.assert_array_equal(tokens[row, :length], reference[:length])
        if rollout.finish_reason[row] == sampler.FINISH_STOP:
            assert tokens[row, length - 1] in stop
        else:
            assert length == NEW_TOKENS
    answer = tokenizer.decode(tokens[0][mask[0]].tolist(), skip_special_tokens=True)
    assert "5" in answer, answer

    # generate_text: chat template, stop tokens and decoding in one call (same shapes: no recompile).
    before = sampler.compilation_counts()
    texts = sampler.generate_text(model, tokenizer, QUESTIONS, max_new_tokens=NEW_TOKENS, greedy=True)
    assert sampler.compilation_counts() == before
    assert texts[0] == [answer]
    assert "Paris" in texts[1][0]


def test_the_engine_decodes_greedily_exactly_as_generate(smollm):
    from jaxgrpo.engine import Engine, Request

    model, tokenizer = smollm
    prompts = sampler.encode_prompts(tokenizer, QUESTIONS + ["Count from one to five."])
    stop = sampler.default_stop_tokens(tokenizer)
    rollout = sampler.generate(model, prompts, max_new_tokens=NEW_TOKENS, greedy=True, stop_tokens=stop,
                               pad_id=tokenizer.pad_token_id)
    # 4 requests through 3 slots of 16-position blocks: one is admitted when another finishes.
    engine = Engine(model, num_slots=3, max_context=128)
    completions = engine.generate([Request(id=i, prompt=p, max_new_tokens=NEW_TOKENS, stop_tokens=tuple(stop),
                                           sampling=sampler.SamplingParams(greedy=True)) for i, p in enumerate(prompts)])
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    for row, completion in enumerate(completions):
        np.testing.assert_array_equal(completion.tokens, tokens[row][mask[row]])
