"""The learning-rate schedule: linear warm-up, then constant or a cosine decay to a floor, per optimizer update."""

import math

import numpy as np
import pytest

from jaxgrpo.config import OptimizerConfig
from jaxgrpo.train.state import learning_rate


def _rates(cfg: OptimizerConfig, updates: int) -> np.ndarray:
    schedule = learning_rate(cfg)
    return np.array([float(schedule(i)) for i in range(updates)])


def test_constant_without_warmup_or_decay():
    np.testing.assert_allclose(_rates(OptimizerConfig(lr=3e-5), 5), 3e-5, rtol=1e-6)


def test_warmup_rises_linearly_from_zero_then_holds():
    rates = _rates(OptimizerConfig(lr=1e-5, warmup_steps=4), 8)
    np.testing.assert_allclose(rates, [0, 2.5e-6, 5e-6, 7.5e-6, 1e-5, 1e-5, 1e-5, 1e-5], rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("warmup", [0, 3])
def test_cosine_decay_after_warmup_reaches_the_floor_and_stays(warmup):
    lr, decay, floor = 2e-5, 10, 0.1
    rates = _rates(OptimizerConfig(lr=lr, warmup_steps=warmup, decay_steps=decay, final_lr_fraction=floor),
                   warmup + decay + 5)
    after = rates[warmup:]
    expected = [lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(i, decay) / decay)))
                for i in range(len(after))]
    np.testing.assert_allclose(after, expected, rtol=1e-5)
    assert after[0] == pytest.approx(lr, rel=1e-6) and after[-1] == pytest.approx(lr * floor, rel=1e-5)
    assert np.all(np.diff(after) <= 1e-12)  # never rises after the warm-up
