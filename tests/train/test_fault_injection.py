"""Kill a run at random points, twice at each site (sampling, update, save, metrics write), resume each time:
the end result is bit for bit the uninterrupted run's."""

import json
import os
import random
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.support import kill_resume
from tests.support.kill_resume import comparable
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOY = os.path.join(ROOT, "experiments", "toy_sum.py")
DRIVER = os.path.join(ROOT, "tests", "support", "fault_injection_driver.py")

STEPS = 8
# The toy task, smaller and without warm-up or evaluation: these runs are about surviving kills.
OVERRIDES = [f"steps={STEPS}", "checkpoint_every=2", "warmup_sft_steps=0", "eval_every=0", "task.num_eval_examples=0",
             "prompts_per_step=4", "group_size=4", "sampling.max_new_tokens=2"]
SITES = ("sample", "update", "save", "metrics")
KILLS_PER_SITE = 2


def kill_plan(seed: int, sites=SITES, kills_per_site: int = KILLS_PER_SITE) -> list[dict]:
    """8 kills, 2 per site, in a seeded random order, each at a random point: a save's in its first call, the
    other sites' in their first and their second call (with one kill per site, either call at random).

    A run restarts from the checkpoint at an even step s and saves next at s + 2, so a kill in the
    first or second call of sampling, update or metrics write lands before that save: the run loses
    its progress. A kill in the first save keeps at most those 2 steps; 2 of them reach step 4 at
    most, so every planned kill happens before the 8 steps are done.
    """
    rng = random.Random(seed)
    sites = [(s, k) for s in sites for k in range(kills_per_site)]
    rng.shuffle(sites)
    return [{"site": s, "call": 1 if s == "save" else (1 + k % 2 if kills_per_site > 1 else rng.choice((1, 2))),
             "point": round(rng.random(), 3)} for s, k in sites]


def final_state(run_dir, steps: int = STEPS) -> dict:
    """Every array of the run's last checkpoint: the train state, the kernel state, the reference policy."""
    return kill_resume.checkpoint(run_dir, steps)


def kill_and_resume(tmp_path, overrides: list[str], kills: list[dict]) -> tuple[str, str]:
    """(straight, killed) run directories: one run uninterrupted, the other killed by `kills` then resumed."""
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    runs = [{"run_dir": straight, "resume": False, "kill": None}]
    runs += [{"run_dir": killed, "resume": i > 0, "kill": kill} for i, kill in enumerate(kills)]
    runs.append({"run_dir": killed, "resume": True, "kill": None})
    plan, results = tmp_path / "plan.json", tmp_path / "results.jsonl"
    plan.write_text(json.dumps({"argv": [TOY, "--set", *overrides], "runs": runs}))
    # One CPU device, and a persistent compilation cache shared by the runs, so a restart does not compile again.
    env = kill_resume.child_env(tmp_path / "jax_cache")
    proc = subprocess.run([sys.executable, DRIVER, str(plan), str(results)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = [json.loads(line) for line in open(results)]
    assert len(outcomes) == len(runs)

    def log(i):
        return open(f"{results}.{i}.log").read()[-3000:]

    assert outcomes[0]["returncode"] == 0, log(0)
    for i, kill in enumerate(kills, start=1):
        assert outcomes[i]["returncode"] == -9, (kill, outcomes[i], log(i))  # every planned kill happened
    assert outcomes[-1]["returncode"] == 0, log(len(runs) - 1)
    return straight, killed


def test_kills_at_every_site_then_resume_give_the_uninterrupted_run(tmp_path):
    straight, killed = kill_and_resume(tmp_path, OVERRIDES, kill_plan(seed=2026))
    jax.tree.map(np.testing.assert_array_equal, final_state(straight)["train"]["params"],
                 final_state(killed)["train"]["params"])
    resumed = comparable(killed)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))  # every step once, no torn line left
    assert resumed == comparable(straight)
    # Kills during saves left orbax temporary directories; the resumed runs cleaned them up.
    assert sorted(os.listdir(os.path.join(killed, "checkpoints"))) == ["4", "6", "8"]


# Slow tier (`-m slow`); in CI instead: test_kills_at_every_site_then_resume_give_the_uninterrupted_run (kills at
# every site, no stateful kernel).
@pytest.mark.slow
def test_a_stateful_kernels_state_survives_kills_bit_for_bit(tmp_path):
    """SPO's value tracker keeps a Beta posterior per prompt in the train state: killed anywhere (while it
    updates its state too) and resumed, the run ends with the uninterrupted run's state and metrics."""
    steps = 6
    overrides = [f"steps={steps}", "checkpoint_every=2", "warmup_sft_steps=0", "eval_every=0",
                 "task.num_eval_examples=0", "prompts_per_step=8", "group_size=1", "sampling.max_new_tokens=2",
                 "advantage=experimental/spo_advantage", "value_tracker=experimental/spo_value_tracker"]
    # One kill per site: only a kill in the first save keeps progress (2 steps), so all happen before step 6.
    kills = kill_plan(seed=7, sites=(*SITES, "track"), kills_per_site=1)
    straight, killed = kill_and_resume(tmp_path, overrides, kills)
    expected, resumed = final_state(straight, steps), final_state(killed, steps)
    jax.tree.map(np.testing.assert_array_equal, expected, resumed)
    tracker = resumed["kernel_state"]["value_tracker"]  # the SPO tracker's Beta posterior per prompt
    alpha = tracker["alpha"] if isinstance(tracker, dict) else tracker[0]
    assert not np.allclose(alpha, alpha.flat[0]), "the tracker's state never changed"
    assert comparable(killed) == comparable(straight)


# Slow tier (`-m slow`); in CI instead: a resumed one-step-off run:
# test_async.py::test_a_resumed_one_step_off_run_is_the_uninterrupted_run
@pytest.mark.slow
def test_one_step_off_survives_kills_anywhere_bit_for_bit(tmp_path):
    """max_staleness=1: killed while the next step's rollout is sampled in its thread, while the learner updates,
    and while a checkpoint (the behaviour policy's weights beside the learner's) is written, then resumed: the run
    ends with the uninterrupted run's state and metrics, the rollout in flight at each kill sampled again."""
    steps = 6
    overrides = [f"steps={steps}", "checkpoint_every=2", "warmup_sft_steps=0", "eval_every=0",
                 "task.num_eval_examples=0", "prompts_per_step=4", "group_size=4", "sampling.max_new_tokens=2",
                 "max_staleness=1"]
    kills = kill_plan(seed=11, sites=("sample", "update", "save"), kills_per_site=1)
    straight, killed = kill_and_resume(tmp_path, overrides, kills)
    expected, resumed = final_state(straight, steps), final_state(killed, steps)
    assert "behaviour" in resumed
    jax.tree.map(np.testing.assert_array_equal, expected, resumed)
    records = comparable(killed)
    assert [r["staleness_max"] for r in records] == [0] + [1] * (steps - 1)
    assert records == comparable(straight)


def test_a_checkpoint_written_before_kernel_state_existed_still_restores(tmp_path):
    """Runs without a stateful kernel checkpoint the train state as before (params, optimizer state, step)."""
    from typing import Any, NamedTuple

    import jax.numpy as jnp

    from jaxgrpo.run.checkpoint import Checkpointer
    from jaxgrpo.train.state import LoopState, TrainState, checkpoint_tree, state_of

    class EarlierTrainState(NamedTuple):  # jaxgrpo's TrainState before it held kernel state
        params: Any
        opt_state: Any
        step: Any

    checkpointer = Checkpointer(str(tmp_path), keep=1)
    checkpointer.save(3, {"train": EarlierTrainState({"w": jnp.arange(3.0)}, (), jnp.array(3, jnp.int32))}, {"step": 3})
    checkpointer.close()
    like = LoopState(TrainState({"w": jnp.zeros(3)}, (), jnp.zeros((), jnp.int32)), None, 0, jax.random.key(0))
    step, restored, _, skipped = Checkpointer(str(tmp_path), keep=1).restore_newest(checkpoint_tree(like))
    state = state_of(restored)
    assert (step, skipped, state.kernel_state, int(state.step)) == (3, [], {}, 3)
    np.testing.assert_array_equal(state.params["w"], [0.0, 1.0, 2.0])
