"""`score`: weighted sums, context forwarding, and samples a reward fails on."""

import functools

import numpy as np
import pytest

from jaxgrpo.rewards import correctness_reward, format_reward, overlong_penalty, reward_name, score

EXAMPLES = [{"answer": "8"}] * 3
COMPLETIONS = ["The answer is 8.", "The answer is 9.", "8"]


def test_score_is_the_weighted_sum_of_the_rewards():
    result = score([(correctness_reward, 1.0), (format_reward, 0.5)], COMPLETIONS, EXAMPLES)
    # correctness [1, 0, 1], format [1, 1, 0].
    np.testing.assert_allclose(result.rewards, [1.5, 0.5, 1.0])
    np.testing.assert_array_equal(result.per_reward["correctness_reward"], [1, 0, 1])
    np.testing.assert_array_equal(result.per_reward["format_reward"], [1, 1, 0])
    assert result.rewards.dtype == np.float32
    assert result.valid.all() and result.num_invalid == 0


def test_score_forwards_token_counts_only_to_rewards_that_take_them():
    def plain(completions, examples):  # no **context: must not receive completion_lengths
        return np.ones(len(completions))

    shaped = functools.partial(overlong_penalty, max_length=10, cache_length=4)
    result = score([(plain, 1.0), (shaped, 2.0)], COMPLETIONS, EXAMPLES, completion_lengths=np.array([4, 8, 12]))
    # overlong: [0, -0.5, -1] -> total 1 + 2 * overlong.
    np.testing.assert_allclose(result.rewards, [1.0, 0.0, -1.0])
    assert set(result.per_reward) == {"plain", "overlong_penalty"}


def test_a_reward_that_raises_on_one_sample_invalidates_only_that_sample():
    def fragile(completions, examples):
        if any("9" in c for c in completions):
            raise RuntimeError("cannot parse")
        return np.full(len(completions), 2.0)

    result = score([(correctness_reward, 1.0), (fragile, 1.0)], COMPLETIONS, EXAMPLES)
    np.testing.assert_array_equal(result.valid, [True, False, True])
    assert result.num_invalid == 1
    np.testing.assert_allclose(result.rewards, [3.0, 0.0, 3.0])
    np.testing.assert_array_equal(result.per_reward["fragile"], [2.0, 0.0, 2.0])


def test_a_reward_that_returns_nan_invalidates_the_sample():
    def sometimes_nan(completions, examples):
        return np.array([np.nan if c == "8" else 1.0 for c in completions])

    result = score([(sometimes_nan, 1.0)], COMPLETIONS, EXAMPLES)
    np.testing.assert_array_equal(result.valid, [True, True, False])
    assert result.num_invalid == 1
    assert np.isfinite(result.rewards).all()
    assert result.metrics()["reward/num_invalid"] == 1.0
    assert result.metrics()["reward/mean"] == pytest.approx(1.0)


def test_repeated_rewards_get_distinct_names():
    result = score([(format_reward, 1.0), (format_reward, 1.0)], COMPLETIONS, EXAMPLES)
    assert list(result.per_reward) == ["format_reward", "format_reward_1"]
    np.testing.assert_allclose(result.rewards, [2.0, 2.0, 0.0])


def test_reward_name_looks_through_partials():
    assert reward_name(functools.partial(functools.partial(overlong_penalty, max_length=8), cache_length=2)) == "overlong_penalty"


def test_a_reward_of_the_wrong_shape_is_named():
    def wrong(completions, examples):
        return np.zeros((len(completions), 2))

    with pytest.raises(ValueError, match=r"reward wrong returned shape \(3, 2\) for 3 completions"):
        score([(wrong, 1.0)], COMPLETIONS, EXAMPLES)


def test_score_names_bad_arguments():
    with pytest.raises(ValueError, match="completions has 3 entries but examples has 1"):
        score([(format_reward, 1.0)], COMPLETIONS, EXAMPLES[:1])
    with pytest.raises(ValueError, match="reward_fns_and_weights is empty"):
        score([], COMPLETIONS, EXAMPLES)
