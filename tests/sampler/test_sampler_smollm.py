"""Sampling the real SmolLM2-135M-Instruct: greedy decoding through the rollout engine equals argmax of full
forwards, through one slot per row and through fewer slots than rows, and under its chat template it answers
"What is 2+3?" with 5."""

import numpy as np
import pytest

import jaxgrpo.models
from jaxgrpo import engine, sampler
from tests.support.references import greedy_without_cache

QUESTIONS = ["What is 2+3?", "What is the capital of France?", "Name a primary color.", "Count from one to five."]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm():
    model, tokenizer = jaxgrpo.models.load("smollm2-135m-instruct")
    prompts = sampler.encode_prompts(tokenizer, QUESTIONS)
    return model, tokenizer, prompts, greedy_without_cache(model, prompts, NEW_TOKENS)


def _assert_greedy(tokens, reference, stop):
    """A completion is the reference up to its first stop token (kept), or all `NEW_TOKENS` of it."""
    stops = np.flatnonzero(np.isin(reference, stop))
    np.testing.assert_array_equal(tokens, reference[:stops[0] + 1 if stops.size else NEW_TOKENS])


def test_greedy_generation_equals_argmax_of_full_forwards_and_answers_five(smollm):
    model, tokenizer, prompts, expected = smollm
    stop = sampler.default_stop_tokens(tokenizer)
    rollout = engine.generate(model, prompts[:3], max_new_tokens=NEW_TOKENS, greedy=True, stop_tokens=stop,
                              pad_id=tokenizer.pad_token_id)
    tokens, mask = rollout.completion_tokens, rollout.completion_mask
    for row in range(3):
        _assert_greedy(tokens[row][mask[row]], expected[row], stop)
        assert (rollout.finish_reason[row] == sampler.FINISH_STOP) == (tokens[row][mask[row]][-1] in stop)
    answer = tokenizer.decode(tokens[0][mask[0]].tolist(), skip_special_tokens=True)
    assert "5" in answer, answer

    # generate_text: chat template, stop tokens and decoding in one call (same shapes: no recompile).
    before = engine.compilation_counts()
    texts = engine.generate_text(model, tokenizer, QUESTIONS[:3], max_new_tokens=NEW_TOKENS, greedy=True)
    assert engine.compilation_counts() == before
    assert texts[0] == [answer]
    assert "Paris" in texts[1][0]


def test_fewer_slots_than_requests_decode_the_same_greedy_tokens(smollm):
    model, tokenizer, prompts, expected = smollm
    stop = sampler.default_stop_tokens(tokenizer)
    # 4 requests through 3 slots of 16-position blocks: one is admitted when another finishes.
    pool = engine.Engine(model, num_slots=3, max_context=128)
    completions = pool.generate([engine.Request(id=i, prompt=p, max_new_tokens=NEW_TOKENS, stop_tokens=tuple(stop),
                                                sampling=sampler.SamplingParams(greedy=True))
                                 for i, p in enumerate(prompts)])
    for completion, reference in zip(completions, expected):
        _assert_greedy(completion.tokens, reference, stop)
