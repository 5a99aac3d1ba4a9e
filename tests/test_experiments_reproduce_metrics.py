"""Every experiment file runs two steps of the tiny model on the toy task and reproduces its recorded metrics
(a file of its own, apart from tests/train/test_trainer.py, so `pytest -n 2 --dist loadfile` can run the two at once)."""

import json
import os

import jax
import numpy as np
import pytest

from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.train import Trainer
from tests.support import experiment_metrics
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
EXPERIMENTS = os.path.join(ROOT, "experiments")


def params_of(trainer):
    return jax.tree.map(np.asarray, trainer.state.params)


RECORDED = json.load(open(experiment_metrics.RECORD))
SMOKE = sorted(RECORDED)  # the experiment files that existed when the metrics were recorded


@pytest.mark.parametrize("name", SMOKE)
def test_every_experiment_runs_two_steps_and_reproduces_its_recorded_metrics(name, tmp_path):
    """Each experiment file, on the tiny model and the toy task: finite metrics, parameters change, and
    every metric equals what the trainer computed before it was split into jaxgrpo/train/
    (tests/support/experiment_metrics.json), within the tolerance of the run's dtype on any CPU family
    (`experiment_metrics.TOLERANCE`)."""
    cfg = load_experiment(os.path.join(EXPERIMENTS, name + ".py"))
    overrides, reward_fns = experiment_metrics.tiny_overrides(cfg, tmp_path / "run")
    apply_overrides(cfg, overrides)
    trainer = Trainer(cfg, reward_fns=reward_fns)
    before = params_of(trainer)
    history = trainer.run(progress=False)
    assert len(history) == 2
    for record in history:
        for key in ("loss", "reward_mean", "grad_norm", "entropy"):
            assert np.isfinite(record[key]), (key, record)
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b), before, params_of(trainer))
    assert any(jax.tree.leaves(changed)), "no parameter changed"
    recorded = RECORDED[name]
    rtol, atol = experiment_metrics.tolerance(cfg)
    for step, (got, want) in enumerate(zip(map(experiment_metrics.comparable, history), recorded), 1):
        assert sorted(got) == sorted(want), (step, set(got) ^ set(want))
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=f"{name} step {step} {key}")
