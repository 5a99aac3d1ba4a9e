"""A run's randomness (`jaxgrpo.rng`): one key from the seed, one stream per purpose, numpy and grain seeded from
them, the same draws on every machine."""

import numpy as np
import pytest

from jaxgrpo import rng


def test_each_purpose_and_index_draws_its_own_numbers():
    root = rng.run_key(0)
    draws = {(p, i): rng.seed_of(rng.stream(root, p, i)) for p in rng.PURPOSES for i in range(4)}
    assert len(set(draws.values())) == len(draws)  # no two purposes or steps share a draw
    assert rng.seed_of(rng.stream(root, "prompts")) != rng.seed_of(rng.stream(rng.run_key(1), "prompts"))
    assert all(0 <= seed < 2**31 for seed in draws.values())


def test_the_draws_are_fixed_for_a_seed():
    """Threefry is the same integer arithmetic on every backend and CPU, so these integers are exact anywhere;
    a purpose inserted before another (not appended to PURPOSES) would change them, and every run's draws."""
    root = rng.run_key(0)
    assert {p: rng.seed_of(rng.stream(root, p)) for p in rng.PURPOSES} == {
        "sample": 1808856048, "evaluate": 15663538, "prompts": 1937995680, "warmup_prompts": 573355701,
        "minibatches": 329970424, "adapters": 1584972724}
    order = rng.generator(rng.stream(root, "minibatches", 3)).permutation(8)
    np.testing.assert_array_equal(order, [3, 4, 6, 5, 0, 7, 1, 2])
    np.testing.assert_array_equal(order, rng.generator(rng.stream(root, "minibatches", 3)).permutation(8))


def test_an_unknown_purpose_is_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown random purpose 'shuffle'; valid purposes: sample, evaluate"):
        rng.stream(rng.run_key(0), "shuffle")
