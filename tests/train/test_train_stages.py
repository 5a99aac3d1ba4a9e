"""The step's stages: kernels of every kind selected by name from an experiment, the fields they read,
and the one-line errors for a wrong kind, unknown keyword arguments and fields the run cannot provide."""

import os

import numpy as np
import pytest

from jaxgrpo import kernels
from jaxgrpo.config import Config, apply_overrides, load_experiment, validate
from jaxgrpo.train import Trainer, inputs, stages
from tests.support import experiment_metrics
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT


def _rejected(*overrides) -> str:
    with pytest.raises(ValueError) as error:
        validate(apply_overrides(Config(), list(overrides)))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_fields_a_kernel_reads_come_from_its_signature():
    assert inputs.fields_read(kernels.get_advantage("grpo")) == (["rewards", "group_ids", "num_groups"], ["valid"])
    assert inputs.fields_read(kernels.get_advantage("stratified_grpo"), {"num_strata": 2})[0] == [
        "rewards", "group_ids", "num_groups", "strata_ids"]
    assert "entropy" in inputs.fields_read(kernels.get_loss("hapo_clip"))[0]
    assert inputs.hyperparameters(kernels.get_loss("ppo_clip")) == ["eps_low", "eps_high", "clip_ratio_c"]


@pytest.mark.parametrize("overrides, needle", [
    (["row_weights=grpo"], "row_weights='grpo' is an advantage kernel, but the row_weights stage takes "
                           "selection kernels"),
    (["reward_shaping=ppo_clip"], "reward_shaping='ppo_clip' is a loss kernel"),
    (["token_credit=nope"], "token_credit='nope' is not a registered credit kernel; valid names: "),
    (["row_weights=dgpo_question_weights", "row_weights_kwargs.temprature=1.0"],
     "row_weights_kwargs key 'temprature' is not an argument of row_weights 'dgpo_question_weights'; valid keys: temperature"),
    (["advantage=stratified_grpo"], "advantage 'stratified_grpo' needs num_strata; set advantage_kwargs={'num_strata': ...}"),
    (["reward_shaping=pref_grpo_win_rate"], "reward_shaping='pref_grpo_win_rate' cannot run in jaxgrpo's loop: it "
                                            "needs a pairwise preference judge"),
    (["loss_mask=high_entropy_token_mask"], "loss_mask='high_entropy_token_mask' cannot run in jaxgrpo's loop: it needs "
                                            "the update's entropy at each token"),
    (["token_credit=tw_grpo_weights"], "token_credit='tw_grpo_weights' cannot run in jaxgrpo's loop: it needs log-probs "
                                       "over the whole vocabulary"),
    (["value_tracker=grpo"], "value_tracker='grpo' is an advantage kernel, but the value_tracker stage takes selection "
                             "kernels"),
    (["value_tracker=mmr1_vas_weights"], "value_tracker='mmr1_vas_weights' is not a tracker (state in, state out); "
                                         "valid names: experimental/spo_value_tracker"),
    (["kl_kind=k3", "kl_kwargs.clamp=10", "kl_kwargs.old_logp=1"], "kl_kwargs key 'old_logp' is passed by the trainer "
                                                                   "itself of kl_kind 'k3'; valid keys: clamp"),
])
def test_a_stage_refuses_what_it_cannot_run_in_one_line(overrides, needle):
    assert needle in _rejected(*overrides)


def tiny(tmp_path, *extra):
    cfg = load_experiment(os.path.join(ROOT, "experiments", "grpo.py"))
    overrides, reward_fns = experiment_metrics.tiny_overrides(cfg, tmp_path / "run")
    apply_overrides(cfg, [*overrides, "loss_kwargs={}", *extra])
    return cfg, reward_fns


def test_a_field_the_task_does_not_provide_is_refused_before_the_first_step(tmp_path):
    cfg, reward_fns = tiny(tmp_path, "advantage=stratified_grpo", "advantage_kwargs.num_strata=2")
    with pytest.raises(ValueError, match="advantage 'stratified_grpo' needs strata_ids .*which the task: examples "
                                         "with a 'strata_id' key provides and this run does not"):
        Trainer(cfg, reward_fns=reward_fns)


def test_spo_advantage_without_its_tracker_is_refused_before_the_first_step(tmp_path):
    cfg, reward_fns = tiny(tmp_path, "advantage=experimental/spo_advantage", "group_size=1")
    with pytest.raises(ValueError, match=r"advantage 'experimental/spo_advantage' needs baseline \(tracked value of each "
                                         r"row's prompt \(SPO\)\), which cfg.value_tracker .* provides and this run does not"):
        Trainer(cfg, reward_fns=reward_fns)


def test_row_weights_per_group_reach_each_row_and_credit_multiplies_tokens():
    """The host stages on a hand-made batch: dgpo weights per row, importance weights per token."""
    n, t = 4, 3
    batch = inputs.BatchInputs(
        rewards=np.array([1, 0, 1, 1], np.float32), reward_columns=np.array([[1], [0], [1], [1]], np.float32),
        reward_weights=np.ones(1, np.float32), correct=np.array([1, 0, 1, 1], np.float32),
        group_ids=np.array([0, 0, 1, 1], np.int32), num_groups=2, valid=np.ones(n, bool),
        lengths=np.full(n, t, np.float32), seq_logp=np.zeros(n, np.float32), mask=np.ones((n, t), np.float32),
        sampler_logp=np.zeros((n, t), np.float32), trainer_logp=np.log(np.full((n, t), 1.5, np.float32)),
        values=None, task_ids={})
    cfg = apply_overrides(Config(), ["prompts_per_step=2", "group_size=2", "token_credit=importance_correction",
                                     "token_credit_kwargs.threshold=1.2"])
    advantages = stages.token_advantages(cfg, batch, t)
    row = np.asarray(kernels.get_advantage("grpo")(batch.rewards, batch.group_ids, num_groups=2))
    np.testing.assert_allclose(advantages, row[:, None] * 1.2 * np.ones((n, t)), rtol=1e-6)  # TIS truncates 1.5 at 1.2
    cfg = apply_overrides(Config(), ["prompts_per_step=2", "group_size=2", "row_weights=mmr1_vas_weights"])
    weights = np.asarray(kernels.get("selection", "mmr1_vas_weights")(np.array([0.5, 1.0], np.float32)))
    np.testing.assert_allclose(stages.token_advantages(cfg, batch, t)[:, 0], row * weights[batch.group_ids], rtol=1e-6)


@pytest.mark.parametrize("name", experiment_metrics.experiment_names())
def test_every_experiment_file_loads_and_validates(name):
    """Each experiment file builds a config whose every stage names a kernel of its kind with valid arguments."""
    validate(load_experiment(os.path.join(ROOT, "experiments", name + ".py")))


# -- declared ranges of the kernels' hyper-parameters (jaxgrpo.kernels.hyperparameters) ----------------------


def test_every_numeric_hyperparameter_of_every_kernel_declares_a_range_its_default_lies_in():
    import inspect

    from jaxgrpo.kernels import hyperparameters

    undeclared, defaults_out = [], []
    for info in kernels.list_kernels():
        parameters = inspect.signature(info.fn).parameters
        for name in inputs.hyperparameters(info.fn):
            types = hyperparameters.declared_type(parameters[name])
            if hyperparameters.is_numeric(types) and name not in info.ranges:
                undeclared.append(f"{info.kind} {info.name}: {name}")
            default = parameters[name].default
            if name in info.ranges and default not in (None, inspect.Parameter.empty):
                try:  # a declared range that refuses the paper's default is a wrong declaration
                    info.check_kwargs({name: default}, context={"group_size": 8, "batch_size": 64})
                except ValueError as error:
                    defaults_out.append(str(error))
    assert not undeclared, f"declare ranges= at registration for: {'; '.join(undeclared)}"
    assert not defaults_out, defaults_out
    assert len(kernels.list_kernels()) >= 86


@pytest.mark.parametrize("overrides, message", [
    (["loss_kwargs.eps_low=-0.2"],
     "loss_kwargs.eps_low=-0.2 is out of range for ppo_clip: must be >= 0 (the lower clip epsilon"),
    (["loss_kwargs.eps_high=abc"],
     "loss_kwargs.eps_high='abc' has the wrong type for ppo_clip: must be a finite number or None"),
    (["loss_kwargs.clip_ratio_c=0.5"], "loss_kwargs.clip_ratio_c=0.5 is out of range for ppo_clip: must be > 1"),
    (["advantage_kwargs.std_ddof=8"],  # the default group_size is 8: every group std would be 0
     "advantage_kwargs.std_ddof=8 is out of range for grpo: must be in [0, group_size=8)"),
    (["group_size=4", "advantage_kwargs.std_ddof=4"],
     "advantage_kwargs.std_ddof=4 is out of range for grpo: must be in [0, group_size=4)"),
    (["advantage_kwargs.std_ddof=1.5"], "advantage_kwargs.std_ddof=1.5 has the wrong type for grpo: must be an integer"),
    (["advantage_kwargs.eps=0"], "advantage_kwargs.eps=0 is out of range for grpo: must be > 0"),
    (["advantage=grpo_batch_std", "advantage_kwargs.std_ddof=64"],
     "advantage_kwargs.std_ddof=64 is out of range for grpo_batch_std: must be in [0, batch_size=64)"),
    (["advantage=reinforce_pp", "advantage_kwargs.whiten='sequences'"],
     "advantage_kwargs.whiten='sequences' is out of range for reinforce_pp: must be one of 'tokens', 'rows'"),
    (["kl_coef=0.1", "kl_kwargs.clamp=-1"], "kl_kwargs.clamp=-1 is out of range for k3: must be > 0"),
    (["advantage=xrpo", "advantage_kwargs.base=opo"],  # opo reads lengths, which xrpo does not pass its base
     "advantage_kwargs.base='opo' is out of range for xrpo: must be one of 'grpo', 'dr_grpo',"),
    (["row_weights=dgpo_question_weights", "row_weights_kwargs.temperature=0"],
     "row_weights_kwargs.temperature=0 is out of range for dgpo_question_weights: must be > 0"),
    (["loss=bapo", "loss_kwargs.lower_max=0.5"],  # a bound naming another hyper-parameter, shown with its value
     "loss_kwargs.lower_max=0.5 is out of range for bapo: must be in [lower_start=0.6, 1]"),
    (["reward_shaping=overlong_penalty", "reward_shaping_kwargs.cache_len=0"],
     "reward_shaping_kwargs.cache_len=0 is out of range for overlong_penalty: must be in (0, max_len=20480]"),
    (["loss_kwargs.eps_low=True"], "loss_kwargs.eps_low=True has the wrong type for ppo_clip: must be a finite number"),
])
def test_out_of_range_or_mistyped_kernel_kwargs_are_refused_by_validate_in_one_line(overrides, message):
    assert message in _rejected(*overrides)


def test_kernel_kwargs_in_range_pass_validate():
    for overrides in (["loss_kwargs.eps_low=0.2", "loss_kwargs.eps_high=0.28", "loss_kwargs.clip_ratio_c=3.0"],
                      ["advantage_kwargs.std_ddof=0"], ["group_size=2", "advantage_kwargs.std_ddof=1"],
                      ["loss_kwargs.eps_high=None"], ["kl_coef=0.1", "kl_kwargs.clamp=10"]):
        validate(apply_overrides(Config(), overrides))


def test_a_range_declaration_that_cannot_be_read_or_names_no_parameter_is_refused_at_registration():
    def loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.2):
        return logp, {}

    with pytest.raises(ValueError, match="cannot read the range 'positive'"):
        kernels.register("loss", "test/bad_range", paper="none", ranges={"eps_low": ("positive", "x")})(loss)
    with pytest.raises(ValueError, match="ranges names 'eps_hi', which is not a parameter"):
        kernels.register("loss", "test/bad_range", paper="none", ranges={"eps_hi": (">= 0", "x")})(loss)
    assert "test/bad_range" not in {k.name for k in kernels.list_kernels("loss")}
