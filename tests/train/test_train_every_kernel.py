"""Every registered kernel of every kind runs two steps of the tiny model from an experiment config, or its
registration declares why it cannot run in the loop and choosing it is refused in one line quoting that. (A
kernel reading an environment's steps, GiGPO, trains on episodes in tests/train/test_train_episodes.py.)

Running ~90 kernels one by one would compile ~90 trainers; instead each run selects one kernel of every
stage at once (`RUNS`: the i-th loss with the i-th advantage, reward shaping, row weights, KL, ...; the
aggregation modes in turn), so the number of runs is the size of the largest kind. A kernel's test asserts what its run produced: finite
metrics at both steps and parameters that changed. A run fails its kernels together, and the failing
kernel is then found by running its name alone (`tiny_config(tmp, **{stage: name})`).
"""

import os

import jax
import numpy as np
import pytest

from jaxgrpo import kernels
from jaxgrpo.config import apply_overrides, load_experiment, validate
from jaxgrpo.train import Trainer, inputs, stages
from jaxgrpo.train import state as state_lib
from tests.support import experiment_metrics
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT

#: The stage (config field) that selects a kernel of each kind.
STAGE_OF_KIND = {"reward": "reward_shaping", "advantage": "advantage", "token_advantage": "advantage",
                 "credit": "token_credit", "selection": "row_weights", "loss": "loss", "mask": "loss_mask",
                 "kl": "kl_kind"}
#: Stages that hold a kernel selected by a config field other than its kind's (a stateful kernel).
STAGE_OF_NAME = {"experimental/spo_value_tracker": "value_tracker"}
#: The overrides a kernel needs beyond its name: required hyper-parameters, and what provides its inputs.
NEEDS = {
    "stratified_grpo": ["advantage_kwargs.num_strata=2"],
    "experimental/spo_advantage": ["group_size=1"],  # single-stream: one completion per prompt
    "mc_grpo_pivot_mask": ["group_size=5"],  # an odd group: the median is one of its samples
}


def stage_of(k) -> str:
    return STAGE_OF_NAME.get(k.name, STAGE_OF_KIND[k.kind])


def on_episodes(k) -> bool:
    """A kernel reading an environment run's steps (GiGPO): it trains in tests/train/test_train_episodes.py."""
    return k.kind == "advantage" and stages.reads_steps(k.fn, {})


def runnable() -> list:
    return [k for k in kernels.list_kernels() if k.loop is None and not on_episodes(k)]


def declared() -> list:
    return [k for k in kernels.list_kernels() if k.loop is not None]


def plan_runs() -> list[dict]:
    """Runs that together select every runnable kernel once: run i takes the i-th kernel of each stage."""
    by_stage: dict[str, list] = {}
    for k in runnable():
        if k.name == "gae" or stage_of(k) == "value_tracker":
            continue  # placed below
        by_stage.setdefault(stage_of(k), []).append(k.name)
    size = max(len(names) for names in by_stage.values())
    runs = [{stage: names[i] for stage, names in by_stage.items() if i < len(names)} for i in range(size)]
    runs.append({"advantage": "gae"})  # the advantage stage is off with a value head: gae gets a run of its own
    for i, run in enumerate(runs):
        if run.get("advantage") == "experimental/spo_advantage":  # SPO's tracker provides its baseline
            run["value_tracker"] = "experimental/spo_value_tracker"
        run["aggregation"] = kernels.AGGREGATION_MODES[i % len(kernels.AGGREGATION_MODES)]  # each mode a few times
    return runs


RUNS = plan_runs()


def run_of(k) -> int:
    return next(i for i, run in enumerate(RUNS) if run.get(stage_of(k)) == k.name)


def task_with_ids():
    """The toy task whose examples carry a stratum and a bundle (stratified_grpo's and riskpo's ids)."""
    from jaxgrpo.data.toy import ToySumTask

    class TaskWithIds(ToySumTask):
        def load(self, split, **kwargs):
            return [{**e, "strata_id": int(e["question"][0]) % 2, "bundle_id": int(e["question"][-1]) % 3}
                    for e in super().load(split, **kwargs)]

    return TaskWithIds()


def overrides_of(run: dict) -> list[str]:
    # packing=false: one compiled update per run (packed shapes vary from step to step; packing is tested elsewhere).
    overrides = ["loss_kwargs={}", "kl_coef=0.01" if "kl_kind" in run else "kl_coef=0", "packing=false"]
    for stage, name in run.items():
        overrides.append(f"{stage}={name}")
        overrides += NEEDS.get(name, [])
    return overrides


def tiny_config(tmp_path, run: dict):
    """experiments/grpo.py on the tiny model and the toy task with `run`'s kernels selected."""
    cfg = load_experiment(os.path.join(ROOT, "experiments", "grpo.py"))
    overrides, reward_fns = experiment_metrics.tiny_overrides(cfg, tmp_path / "run")
    apply_overrides(cfg, [*overrides, *overrides_of(run)])
    return cfg, reward_fns


_RESULTS: dict[int, tuple] = {}


def run_result(i: int, tmp_path_factory):
    """(history, whether any parameter changed) of run i, computed once per session."""
    if i not in _RESULTS:
        cfg, reward_fns = tiny_config(tmp_path_factory.mktemp(f"run{i}"), RUNS[i])
        # One device: the sharded paths are tested elsewhere; here 8 fake devices would only make ~26 runs slower.
        mesh = state_lib.make_mesh(cfg, devices=jax.devices()[:1])
        trainer = Trainer(cfg, reward_fns=reward_fns, task=task_with_ids(), mesh=mesh)
        before = jax.tree.map(np.asarray, trainer.state.params)
        history = trainer.run(progress=False)
        after = jax.tree.map(np.asarray, trainer.state.params)
        changed = any(jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)))
        _RESULTS[i] = history, changed
    return _RESULTS[i]


def test_every_registered_kernel_either_runs_or_declares_why_not():
    """A new registration must choose: runnable (then a run below selects it) or a declared reason."""
    planned = {name for run in RUNS for stage, name in run.items() if stage != "aggregation"}
    for k in kernels.list_kernels():
        assert (k.loop is None) == (k.name in planned or on_episodes(k)), k
        # A kernel reading a field nothing in the loop provides must say so in its registration.
        assert inputs.loop_support(k.fn) is None or k.loop is not None, (k.kind, k.name, inputs.loop_support(k.fn))


@pytest.mark.parametrize("kernel", runnable(), ids=lambda k: f"{k.kind}:{k.name}")
def test_kernel_runs_two_steps_from_an_experiment(kernel, tmp_path_factory):
    history, changed = run_result(run_of(kernel), tmp_path_factory)
    assert len(history) == 2
    for record in history:
        assert all(np.isfinite(v) for k, v in record.items() if k in ("loss", "grad_norm", "policy_loss", "kl")), record
        assert record["frac_trained_rows"] > 0, record
    assert changed, "no parameter changed"


@pytest.mark.parametrize("kernel", declared(), ids=lambda k: f"{k.kind}:{k.name}")
def test_kernel_with_a_declared_reason_is_refused_before_anything_is_built(kernel, tmp_path, monkeypatch):
    def no_model(cfg):
        raise AssertionError("a model was built for a config that should have been refused")

    monkeypatch.setattr(state_lib, "build_model", no_model)
    cfg, reward_fns = tiny_config(tmp_path, {stage_of(kernel): kernel.name})
    with pytest.raises(ValueError) as error:
        Trainer(cfg, reward_fns=reward_fns, task=task_with_ids())
    message = str(error.value)
    assert "\n" not in message and kernel.loop in message and "cannot run in jaxgrpo's loop" in message


def test_the_runs_cover_each_stage_with_its_own_kernels():
    """Each run validates: no stage is handed a kernel of another kind by the plan."""
    for run in RUNS:
        cfg = apply_overrides(load_experiment(os.path.join(ROOT, "experiments", "grpo.py")), overrides_of(run))
        validate(cfg)
        for stage, name in run.items():
            assert getattr(cfg, stage) == name
    assert {stage.field for stage in stages.STAGES} >= {stage for run in RUNS for stage in run} - {"aggregation"}
