"""The sampler's pure pieces: the truncated sampling distribution, per-row keys, bucketing, input checks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import sampler
from jaxgrpo.sampler import SamplingParams

# A fixed distribution over 6 tokens (temperature 1).
PROBS = np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
LOGITS = np.log(PROBS).astype(np.float32)

# Expected sampling distributions, renormalized by hand.
CASES = {
    # top-k 3: {0, 1, 2}, mass 0.75
    "top_k=3": (dict(top_k=3), [0.30 / 0.75, 0.25 / 0.75, 0.20 / 0.75, 0, 0, 0]),
    # top-p 0.5: mass before tokens 0, 1, 2 is 0, 0.30, 0.55 -> keep {0, 1}, mass 0.55
    "top_p=0.5": (dict(top_p=0.5), [0.30 / 0.55, 0.25 / 0.55, 0, 0, 0, 0]),
    # min-p 0.3: keep p >= 0.09 -> {0, 1, 2, 3}, mass 0.87
    "min_p=0.3": (dict(min_p=0.3), [0.30 / 0.87, 0.25 / 0.87, 0.20 / 0.87, 0.12 / 0.87, 0, 0]),
    # top-k 5 renormalizes to p / 0.95; top-p 0.8 on it: mass before token 3 is 0.75 / 0.95 = 0.789 < 0.8,
    # before token 4 it is 0.87 / 0.95 = 0.916 -> keep {0, 1, 2, 3}; then min-p 0.5 keeps p >= 0.15
    # -> {0, 1, 2}, mass 0.75
    "top_k=5,top_p=0.8,min_p=0.5": (dict(top_k=5, top_p=0.8, min_p=0.5), [0.40, 0.25 / 0.75, 0.20 / 0.75, 0, 0, 0]),
    # temperature 2 then top-k 2: p ∝ sqrt(p) over {0, 1}
    "temperature=2,top_k=2": (
        dict(temperature=2.0, top_k=2),
        [np.sqrt(0.30) / (np.sqrt(0.30) + np.sqrt(0.25)), np.sqrt(0.25) / (np.sqrt(0.30) + np.sqrt(0.25)), 0, 0, 0, 0],
    ),
    "untruncated": (dict(), list(PROBS)),
}


DRAWS = 40_000


@functools.lru_cache(maxsize=None)
def _all_cases():
    """For every case: the sampling log-probs of LOGITS and DRAWS samples with their log-probs (one compile)."""

    @jax.jit
    def run(key, logits):
        keys = jax.random.split(key, DRAWS)
        batch = jnp.broadcast_to(logits, (DRAWS, logits.size))
        out = {}
        for name, (kwargs, _) in CASES.items():
            params = SamplingParams(**kwargs)
            out[name] = (sampler.sampling_log_probs(logits[None], params)[0], *sampler.sample_tokens(keys, batch, params))
        return out

    return jax.device_get(run(jax.random.key(123), jnp.asarray(LOGITS)))


@pytest.mark.parametrize("case", list(CASES))
def test_sampling_log_probs_equal_the_hand_renormalized_distribution(case):
    expected = np.asarray(CASES[case][1])
    log_probs = _all_cases()[case][0]
    np.testing.assert_allclose(np.exp(log_probs), expected, atol=1e-6)
    assert np.all(np.isneginf(log_probs[expected == 0]))


@pytest.mark.parametrize("case", list(CASES))
def test_samples_land_in_the_support_with_the_renormalized_frequencies(case):
    kwargs, expected = CASES[case]
    expected = np.asarray(expected)
    _, tokens, logprobs, policy_logprobs = _all_cases()[case]
    counts = np.bincount(tokens, minlength=LOGITS.size)
    assert counts[expected == 0].sum() == 0, f"samples outside the support: {counts}"
    # Each bin's frequency within 5 binomial standard deviations of its renormalized probability.
    std = np.sqrt(expected * (1 - expected) / DRAWS)
    np.testing.assert_array_less(np.abs(counts / DRAWS - expected), 5 * std + 1e-12)
    # The reported log-prob is that of the truncated distribution; the policy one is untruncated.
    np.testing.assert_allclose(logprobs, np.log(expected[tokens]), atol=1e-5)
    temperature = kwargs.get("temperature", 1.0)
    tempered = np.exp(LOGITS / temperature) / np.exp(LOGITS / temperature).sum()
    np.testing.assert_allclose(policy_logprobs, np.log(tempered[tokens]), atol=1e-5)


def test_greedy_takes_the_argmax_with_log_prob_zero():
    logits = jnp.asarray([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    params = SamplingParams(greedy=True)
    tokens, logprobs, policy_logprobs = jax.jit(sampler.sample_tokens, static_argnums=2)(
        jax.random.split(jax.random.key(0), 2), logits, params)
    assert tokens.tolist() == [1, 0]
    assert logprobs.tolist() == [0.0, 0.0]
    np.testing.assert_allclose(policy_logprobs, jax.nn.log_softmax(logits)[jnp.arange(2), tokens], atol=1e-6)
    assert SamplingParams(temperature=0.0).greedy


def test_a_rows_draw_depends_only_on_its_key_and_logits():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(5, 50)), jnp.float32)
    keys = jax.random.split(jax.random.key(7), 5)
    params = SamplingParams(temperature=1.3, top_p=0.9)
    sample = jax.jit(sampler.sample_tokens, static_argnums=2)
    together = sample(keys, logits, params)[0]
    alone = [int(sample(keys[i:i + 1], logits[i:i + 1], params)[0][0]) for i in range(5)]
    assert together.tolist() == alone


def test_row_keys_depend_on_prompt_id_and_sample_index_only():
    key = jax.random.key(3)
    keys = jax.jit(sampler.row_keys, static_argnums=2)(key, jnp.asarray([4, 9]), 3)
    assert keys.shape == (6,)
    data = jax.random.key_data
    # Row b * G + g of prompt id p is fold_in(key, p * G + g), wherever the prompt sits in the batch.
    np.testing.assert_array_equal(data(keys[4]), data(jax.random.fold_in(key, 9 * 3 + 1)))
    np.testing.assert_array_equal(data(sampler.row_keys(key, jnp.asarray([9]), 3)), data(keys[3:]))
    stepped = sampler.step_keys(keys, 5)
    np.testing.assert_array_equal(data(stepped[2]), data(jax.random.fold_in(keys[2], 5)))
    assert len({tuple(np.asarray(data(k)).tolist()) for k in stepped}) == 6


def test_bucket_length_is_the_next_power_of_two_at_least_16():
    assert [sampler.bucket_length(n) for n in (1, 16, 17, 32, 33, 100, 1000)] == [16, 16, 32, 32, 64, 128, 1024]
    assert sampler.bucket_length(3, minimum=4) == 4


def test_left_pad_puts_padding_first():
    tokens, mask = sampler.left_pad([[5, 6, 7], [8]], 4, pad_id=1)
    assert tokens.tolist() == [[1, 5, 6, 7], [1, 1, 1, 8]]
    assert mask.tolist() == [[False, True, True, True], [False, False, False, True]]


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(min_p=1.0), "min_p"),
        (dict(temperature=-0.5), "temperature"),
    ],
)
def test_bad_sampling_parameters_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SamplingParams(**kwargs)


def test_stop_set_is_padded_to_a_fixed_size_with_an_impossible_token():
    stop = sampler.stop_array([2, 0, 2])
    assert stop.tolist() == [0, 2, -1, -1, -1, -1, -1, -1]
    assert sampler.stop_array([]).shape == (8,)


@pytest.mark.parametrize("name, replacement", [("generate", "jaxgrpo.engine.generate"),
                                               ("generate_text", "jaxgrpo.engine.generate_text"),
                                               ("decode_program", "jaxgrpo.engine.programs")])
def test_the_fixed_batch_samplers_names_say_where_sampling_went(name, replacement):
    with pytest.raises(AttributeError) as error:
        getattr(sampler, name)
    message = str(error.value)
    assert "the rollout engine is the only sampler" in message and replacement in message and "\n" not in message
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        sampler.no_such_name  # noqa: B018


@pytest.mark.parametrize("forms", ["plain", "cpu"])
def test_untruncated_draws_over_several_blocks_in_each_programs_forms(forms, monkeypatch):
    """Temperature sampling over a vocabulary of several sampling blocks (the last padded), the blocks' maxima and
    sums taken as each backend's program takes them (`MemoryForms.online_softmax`: one pass on accelerators, the
    maximum first on CPUs): the reported log-prob is log_softmax's, the frequencies of the likeliest tokens are
    their probabilities', and both forms draw the same tokens from the same keys (the same inverse CDF, up to
    rounding at a block's edge)."""
    from jaxgrpo.models import backend, cpu_forms, memory_forms

    vocab, draws = 2 * sampler.distribution.SAMPLING_BLOCK + 452, 20_000
    logits = jnp.asarray(np.random.default_rng(5).normal(scale=3.0, size=vocab), jnp.float32)
    params = SamplingParams(temperature=0.8)
    keys = jax.random.split(jax.random.key(11), draws)

    def draw(chosen):
        monkeypatch.setattr(backend, "memory_for_program", lambda: chosen)
        jax.clear_caches()
        return jax.device_get(jax.jit(lambda k: sampler.sample_tokens(k, jnp.broadcast_to(logits, (draws, vocab)),
                                                                        params))(keys))

    tokens, logprobs, policy_logprobs = draw(memory_forms.PLAIN if forms == "plain" else cpu_forms.FORMS)
    expected = np.asarray(jax.nn.log_softmax(logits / 0.8))
    np.testing.assert_allclose(logprobs, expected[tokens], atol=1e-5)
    np.testing.assert_array_equal(policy_logprobs, logprobs)
    probs = np.exp(expected)
    likeliest = np.argsort(probs)[-10:]
    frequencies = np.bincount(tokens, minlength=vocab)[likeliest] / draws
    std = np.sqrt(probs[likeliest] * (1 - probs[likeliest]) / draws)
    np.testing.assert_array_less(np.abs(frequencies - probs[likeliest]), 5 * std)
    other, _, _ = draw(cpu_forms.FORMS if forms == "plain" else memory_forms.PLAIN)
    assert (other == tokens).mean() > 0.999
