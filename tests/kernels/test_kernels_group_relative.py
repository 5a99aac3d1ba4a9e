"""`group_relative`, declared when an advantage is registered, says what the kernel does: a declared estimator gives
every row of a one-row group an advantage of 0 (and a signal to groups of two), an undeclared one a signal to
one-row groups. `validate` refuses group_size=1 for the declared ones (tests/config/test_config.py)."""

import numpy as np
import pytest

import jaxgrpo  # noqa: F401  (registers every kernel)
from jaxgrpo import kernels
from jaxgrpo.train import inputs as inputs_lib, stages

N, T = 6, 3
REWARDS = np.array([0.0, 1.0, 0.25, 0.75, 1.0, 0.0], np.float32)
#: Hyper-parameters a kernel needs to run at all.
NEEDS = {"stratified_grpo": {"num_strata": 2}}


def batch(group_ids) -> inputs_lib.BatchInputs:
    """Six rows with differing rewards in the given groups, every field an advantage may read."""
    group_ids = np.asarray(group_ids, np.int32)
    return inputs_lib.BatchInputs(
        rewards=REWARDS, reward_columns=REWARDS[:, None], reward_weights=np.ones(1, np.float32),
        correct=(REWARDS > 0.5).astype(np.float32), group_ids=group_ids, num_groups=int(group_ids.max()) + 1,
        valid=np.ones(N, bool), lengths=np.array([1, 2, 3, 2, 1, 3], np.float32), seq_logp=-np.ones(N, np.float32),
        mask=np.ones((N, T), np.float32), sampler_logp=-np.ones((N, T), np.float32),
        trainer_logp=-np.ones((N, T), np.float32), values=np.zeros((N, T), np.float32),
        task_ids={"strata_ids": np.array([0, 0, 1, 1, 0, 0], np.int32), "bundle_ids": group_ids,
                  "baseline": np.full(N, 0.5, np.float32)},
        # One-turn episodes from one state: a step-level kernel (GiGPO) sees each row as one step.
        steps=inputs_lib.Steps.of_episodes([[r] for r in REWARDS], [["start"]] * N, np.zeros((N, T)), discount=1.0))


def advantages(kernel, group_ids) -> np.ndarray:
    rows = batch(group_ids)
    out = inputs_lib.call(kernel.fn, rows.of_steps() if stages.reads_steps(kernel.fn, {}) else rows,
                          NEEDS.get(kernel.name, {}))
    return np.asarray(out[0] if isinstance(out, tuple) else out)


RUNNABLE = [k for kind in ("advantage", "token_advantage") for k in kernels.list_kernels(kind) if k.loop is None]


@pytest.mark.parametrize("kernel", RUNNABLE, ids=[k.name for k in RUNNABLE])
def test_the_declaration_says_whether_a_group_of_one_gets_a_signal(kernel):
    alone = advantages(kernel, np.arange(N))
    if kernel.group_relative:
        np.testing.assert_array_equal(alone, 0.0)
        assert np.abs(advantages(kernel, [0, 0, 1, 1, 2, 2])).max() > 0  # it does give groups of two a signal
    else:
        assert np.isfinite(alone).all() and np.abs(alone).max() > 0, (
            f"{kernel.name} gives one-row groups no signal: declare it with group_relative=True")


def test_the_baseline_estimators_are_declared():
    declared = {k.name for k in kernels.list_kernels("advantage") if k.group_relative}
    assert {"grpo", "dr_grpo", "rloo"} <= declared
    assert not {"reinforce_pp", "reinforce_pp_baseline"} & declared
