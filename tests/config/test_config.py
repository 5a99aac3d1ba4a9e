"""The config system: experiment files, command-line overrides and their errors."""

import copy
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

from jaxgrpo.config import Config, ExperimentError, apply_overrides, load_experiment, to_dict, valid_keys, validate
from jaxgrpo.evaluation.runs import config_from_dict
from jaxgrpo.run.rundir import config_changes
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
EXPERIMENTS = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py"))


def test_overrides_set_nested_typed_fields():
    cfg = apply_overrides(Config(), ["optimizer.lr=1e-6", "group_size=8", "group_filter=dynamic_sampling_filter",
                                      "loss_kwargs.eps_high=0.28", "aggregation_max_len=none", "task.name=gsm8k"])
    assert cfg.optimizer.lr == 1e-6 and isinstance(cfg.optimizer.lr, float)
    assert cfg.group_size == 8 and isinstance(cfg.group_size, int)
    assert cfg.group_filter == "dynamic_sampling_filter"
    assert cfg.loss_kwargs == {"eps_high": 0.28}
    assert cfg.aggregation_max_len is None
    assert cfg.task.name == "gsm8k"


def test_unknown_key_lists_valid_keys():
    with pytest.raises(KeyError, match=r"unknown config key 'optimizer\.lrr'.*optimizer\.lr"):
        apply_overrides(Config(), ["optimizer.lrr=1e-6"])


def test_bad_values_and_forms_are_named():
    with pytest.raises(ValueError, match="bad value for group_size: expected int"):
        apply_overrides(Config(), ["group_size=eight"])
    with pytest.raises(ValueError, match="must look like key=value"):
        apply_overrides(Config(), ["group_size"])
    with pytest.raises(KeyError, match="is a section"):
        apply_overrides(Config(), ["optimizer=3"])


def test_valid_keys_cover_nested_sections():
    keys = valid_keys(Config())
    assert "optimizer.lr" in keys and "sampling.temperature" in keys and "group_size" in keys


def test_batch_not_divisible_says_what_to_change():
    cfg = apply_overrides(Config(), ["prompts_per_step=3", "group_size=3", "num_minibatches=2"])
    with pytest.raises(ValueError, match=r"prompts_per_step\*group_size=9 is not divisible by num_minibatches=2"):
        validate(cfg)
    cfg = apply_overrides(Config(), ["prompts_per_step=2", "group_size=4", "micro_batch_size=3"])
    with pytest.raises(ValueError, match="not divisible by micro_batch_size=3"):
        validate(cfg)
    # The update lays a micro-batch's rows over the data x fsdp shards: fewer rows than shards do not split.
    cfg = apply_overrides(Config(), ["prompts_per_step=2", "group_size=2"])
    validate(cfg, row_shards=4)
    with pytest.raises(ValueError, match="micro-batch of 4 sequences cannot be split over the mesh's 8 data x fsdp"):
        validate(cfg, row_shards=8)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_file_builds_a_valid_config(name):
    cfg = load_experiment(os.path.join(ROOT, "experiments", name))
    validate(cfg)
    assert cfg.run_dir.endswith(name[:-3]) or name == "quickstart.py"


def test_experiment_without_entry_point(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("x = 1\n")
    with pytest.raises(AttributeError, match=r"must define a function config\(\)"):
        load_experiment(str(path))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_experiment(str(tmp_path / "missing.py"))


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "jaxgrpo.tools.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_errors_are_one_line(tmp_path):
    """A config typo, a missing entry point, an indivisible batch: exit 2 with one line saying what to fix."""
    grpo = os.path.join(ROOT, "experiments", "grpo.py")
    no_entry = tmp_path / "no_entry.py"
    no_entry.write_text("x = 1\n")
    cases = {
        ("--set", "optimzer.lr=1"): ["unknown config key 'optimzer.lr'", "optimizer.lr"],
        (str(no_entry),): ["must define a function config()"],
        (str(tmp_path / "nope.py"),): ["not found"],
        ("--set", "prompts_per_step=3", "group_size=3", "num_minibatches=2"): ["not divisible by num_minibatches=2"],
    }
    for args, needles in cases.items():
        argv = args if not args[0].startswith("--") else (grpo, *args)
        proc = _cli(*argv, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error:"), (args, lines)
        assert all(n in lines[0] for n in needles), (args, lines[0])


# -- nothing a user gives is silently wrong or lost ------------------------------------


def _rejected(*overrides):
    """The ValueError message `validate` gives for the default config with `overrides` applied."""
    with pytest.raises(ValueError) as error:
        validate(apply_overrides(Config(), list(overrides)))
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("temperature", ["0", "-1"])
def test_training_temperature_must_be_positive(temperature):
    """Temperature 0 used to train on NaN losses (the sampler reads it as greedy, the trainer divides by it)."""
    message = _rejected(f"sampling.temperature={temperature}")
    assert message.startswith("sampling.temperature must be > 0 for training")
    assert "group-relative advantages are all zero" in message and "greedy decoding is for evaluation" in message


@pytest.mark.parametrize("override, needle", [
    ("optimizer.lr=-1", "optimizer.lr must be > 0"),  # used to train as gradient ascent
    ("optimizer.lr=0", "optimizer.lr must be > 0"),
    ("optimizer.b1=1", "optimizer.b1 must be in [0, 1)"),
    ("optimizer.b2=-0.5", "optimizer.b2 must be in [0, 1)"),
    ("optimizer.eps=0", "optimizer.eps must be > 0"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay must be >= 0"),
    ("optimizer.warmup_steps=-1", "optimizer.warmup_steps must be >= 0"),
    ("optimizer.decay_steps=-3", "optimizer.decay_steps must be >= 0"),
    ("optimizer.final_lr_fraction=1.5", "optimizer.final_lr_fraction must be in [0, 1]"),
    ("optimizer.max_grad_norm=0", "optimizer.max_grad_norm must be > 0"),
])
def test_optimizer_values_must_make_sense(override, needle):
    assert needle in _rejected(override)


@pytest.mark.parametrize("override, needle", [
    ("sampling.top_k=-1", "sampling.top_k must be >= 0"),
    ("sampling.top_p=1.5", "sampling.top_p must be in (0, 1]"),
    ("sampling.top_p=0", "sampling.top_p must be in (0, 1]"),
    ("sampling.min_p=1", "sampling.min_p must be in [0, 1)"),
    ("sampling.max_new_tokens=0", "sampling.max_new_tokens must be >= 1"),
    ("sampling.max_prompt_len=0", "sampling.max_prompt_len must be >= 1"),
    ("num_minibatches=0", "num_minibatches must be >= 1"),
    ("num_epochs=0", "num_epochs must be >= 1"),
    ("micro_batch_size=0", "micro_batch_size must be >= 1"),
    ("aggregation_max_len=0", "aggregation_max_len must be >= 1"),
    ("dtype=float16", "dtype must be one of float32, bfloat16, got 'float16'"),
    ("eval_pass_k=0", "eval_pass_k must be >= 1"),
    ("eval_every=-1", "eval_every must be >= 0"),
    ("checkpoint_every=-1", "checkpoint_every must be >= 0"),
    ("keep_checkpoints=0", "keep_checkpoints must be >= 1"),
    ("log_every=0", "log_every must be >= 1"),
    ("kl_coef=-0.1", "kl_coef must be >= 0"),
    ("max_sampling_rounds=0", "max_sampling_rounds must be >= 1"),
    ("value_coef=-1", "value_coef must be >= 0"),
    ("reward_penalty_kwargs={'cache_len': 8}", "reward_penalty_kwargs={'cache_len': 8} is set but reward_penalty is "
                                               "None, so nothing would read it"),
    ("mesh.data=0", "mesh.data must be -1 (every remaining device) or >= 1"),
    ("mesh.model=-2", "mesh.model must be -1 (every remaining device) or >= 1"),
    ("max_nonfinite_steps=-1", "max_nonfinite_steps must be >= 0 (0 = never stop)"),
])
def test_out_of_range_values_are_named(override, needle):
    assert needle in _rejected(override)


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo"])
def test_one_completion_per_prompt_is_refused_for_a_group_relative_advantage(advantage):
    """Before: group_size=1 with GRPO gave every row an advantage of 0, and the run trained nothing, exit 0."""
    cfg = apply_overrides(Config(), ["group_size=1", f"advantage={advantage}"])
    with pytest.raises(ValueError, match=rf"group_size=1 with advantage='{advantage}': .* 0 for every row .* set "
                                         r"group_size >= 2, or pick an advantage that works with one sample \(.*"
                                         r"reinforce_pp.*\), or advantage='gae'"):
        validate(cfg)


@pytest.mark.parametrize("overrides", [["advantage=reinforce_pp"], ["advantage=reinforce_pp_baseline"],
                                       ["advantage=gae"], ["advantage=experimental/spo_advantage",
                                                             "value_tracker=experimental/spo_value_tracker"]],
                         ids=["reinforce_pp", "reinforce_pp_baseline", "gae", "spo"])
def test_one_completion_per_prompt_is_allowed_for_advantages_that_need_no_group(overrides):
    validate(apply_overrides(Config(), ["group_size=1", *overrides]))


@pytest.mark.parametrize("override, named", [("reward_shaping=overlong_penalty", "reward_shaping="),
                                             ("token_credit=importance_correction", "token_credit="),
                                             ("row_weights=dgpo_question_weights", "row_weights=")])
def test_a_value_head_refuses_the_group_advantage_stages_it_would_ignore(override, named):
    """GAE over the value head is the advantage: a host stage set beside it is refused, not silently skipped."""
    line = _rejected("advantage=gae", override)
    assert "advantage='gae' computes the advantages by GAE over the value head" in line and named in line
    assert Config(advantage="gae").value_head and not Config().value_head


def test_gae_discounts_out_of_range_are_named():
    assert "advantage_kwargs.gamma" in _rejected("advantage=gae", "advantage_kwargs={'gamma': 1.1}")
    assert "advantage_kwargs.lam" in _rejected("advantage=gae", "advantage_kwargs={'lam': -0.1}")
    # A length penalty's window lies inside its max_len, which is the sampler's max_new_tokens unless given.
    for cache_len in (0, 2000):
        line = _rejected("reward_penalty=overlong_penalty", f"reward_penalty_kwargs.cache_len={cache_len}")
        assert "reward_penalty_kwargs.cache_len" in line
    validate(apply_overrides(Config(), ["reward_penalty=overlong_penalty", "reward_penalty_kwargs.cache_len=64"]))


@pytest.mark.parametrize("old, new", [
    ("value_head=true", "advantage='gae'"), ("gae_gamma=0.9", "advantage_kwargs={'gamma'"),
    ("gae_lambda=0.9", "advantage_kwargs={'lam'"), ("dynamic_sampling=true", "group_filter='dynamic_sampling_filter'"),
    ("overlong_cache_len=8", "reward_penalty='overlong_penalty'")])
def test_a_flag_that_became_a_stage_is_refused_with_the_stage_to_set(old, new):
    """The flags dynamic_sampling, overlong_cache_len and value_head (with gae_gamma, gae_lambda) are stages now: an
    old experiment file or --set names the stage to set, in one line, instead of "unknown key"."""
    with pytest.raises(KeyError) as error:
        apply_overrides(Config(), [old])
    assert "is now a stage like the others" in str(error.value) and new in str(error.value)
    cfg = Config()
    with pytest.raises(AttributeError, match="is now a stage like the others: set " + re.escape(new)):
        setattr(cfg, old.split("=")[0], True)


def test_a_run_written_with_the_old_flags_reads_as_their_stages():
    """A config.json written before the flags became stages resumes and compares as the same run."""
    old = {**to_dict(Config()), "value_head": True, "gae_gamma": 0.9, "gae_lambda": 0.8, "dynamic_sampling": True,
           "overlong_cache_len": 16}
    cfg = config_from_dict(old)
    assert (cfg.advantage, cfg.advantage_kwargs) == ("gae", {"gamma": 0.9, "lam": 0.8}) and cfg.value_head
    assert cfg.group_filter == "dynamic_sampling_filter"
    assert (cfg.reward_penalty, cfg.reward_penalty_kwargs) == ("overlong_penalty", {"cache_len": 16})
    unchanged = {**to_dict(Config()), "value_head": False, "dynamic_sampling": False, "overlong_cache_len": 0}
    assert to_dict(config_from_dict(unchanged)) == to_dict(Config())


@pytest.mark.parametrize("value", ["false", "true"])
def test_the_removed_sampling_engine_setting_is_refused_with_what_to_do(value):
    """`sampling.engine` chose the fixed batch over the rollout engine until 2026-12-06: an old experiment file or
    --set is told in one line that the engine is the trainer's only sampler, not "unknown key"."""
    with pytest.raises(KeyError) as error:
        apply_overrides(Config(), [f"sampling.engine={value}"])
    line = str(error.value).strip("'\"")
    assert line.startswith("config key 'sampling.engine': sampling.engine was removed") and "drop the setting" in line
    assert "\n" not in line
    with pytest.raises(AttributeError, match="the trainer samples through the rollout engine only"):
        Config().sampling.engine = value == "true"
    # A run written with it (either value) reads, resumes and compares as the same run without it.
    for engine in (False, True):
        old = to_dict(Config())
        old["sampling"] = {**old["sampling"], "engine": engine}
        assert to_dict(config_from_dict(old)) == to_dict(Config())
        assert config_changes(old, to_dict(Config()), to_dict(Config())) == []


def test_a_group_filter_must_return_the_rows_to_keep():
    """A selection kernel of weights (not bool[N]) named as the group filter would keep every row: refused."""
    line = _rejected("group_filter=dgpo_question_weights")
    assert "group_filter='dgpo_question_weights' returns float32" in line and "not bool[64]" in line
    validate(apply_overrides(Config(), ["group_filter=mc_grpo_pivot_mask"]))
    validate(apply_overrides(Config(), ["group_filter=dynamic_sampling_filter", "group_filter_kwargs.atol=0.1"]))


def test_mesh_takes_the_remaining_devices_on_one_axis_only():
    assert "at most one mesh axis may be -1" in _rejected("mesh.fsdp=-1")
    validate(apply_overrides(Config(), ["mesh.data=2", "mesh.fsdp=-1"]))


def test_wrong_types_are_named():
    cfg = Config()
    cfg.optimizer.lr = "1e-6"
    with pytest.raises(ValueError, match=r"optimizer\.lr must be a finite float, got str '1e-6'"):
        validate(cfg)
    cfg = Config()
    cfg.micro_batch_size = 2.0
    with pytest.raises(ValueError, match="micro_batch_size must be int or None, got float 2.0"):
        validate(cfg)
    cfg = Config()
    cfg.entropy_coef = float("nan")
    with pytest.raises(ValueError, match="entropy_coef must be a finite float, got float nan"):
        validate(cfg)


@pytest.mark.parametrize("override, needle", [
    ("loss_kwargs.eps_hgih=0.28",
     "loss_kwargs key 'eps_hgih' is not an argument of loss 'ppo_clip'; valid keys: eps_low, eps_high, clip_ratio_c"),
    ("advantage_kwargs.std_dof=0",
     "advantage_kwargs key 'std_dof' is not an argument of advantage 'grpo'; valid keys: std_ddof, eps"),
    ("advantage_kwargs.num_groups=4",
     "advantage_kwargs key 'num_groups' is passed by the trainer itself of advantage 'grpo'; valid keys: std_ddof, eps"),
    ("loss_kwargs.mask=1", "loss_kwargs key 'mask' is passed by the trainer itself of loss 'ppo_clip'"),
])
def test_kernel_kwargs_are_checked_against_the_signature(override, needle):
    assert needle in _rejected(override)


def test_kernel_arguments_the_trainer_cannot_supply_are_named():
    # Registered kernels declare why they cannot run in the loop; the refusal quotes the declaration.
    assert ("loss='critique_grpo' cannot run in jaxgrpo's loop: it needs critique-guided refinements (the "
            "prefix_mask of an off-policy refined prefix)") in _rejected("loss=critique_grpo")
    # GiGPO reads an environment run's steps: without an environment, the config alone is refused.
    assert ("advantage 'gigpo' needs step_returns (discounted return from each turn (cfg.environment.discount)), "
            "which cfg.environment (its episodes' turn rewards) provides and this run does not") in _rejected(
        "advantage=gigpo")
    assert "needs budget; set token_credit_kwargs" not in _rejected("advantage=gigpo")
    # A user's kernel that declares nothing is refused by the field nothing in the loop provides.
    from jaxgrpo.kernels import registry

    registry.register_advantage("test/needs_hits")(lambda rewards, group_ids, *, num_groups, hits: rewards)
    try:
        assert ("advantage 'test/needs_hits' needs hits (relevance of each ranked item), which only a ranking task "
                "(Rank-GRPO) provides") in _rejected("advantage=test/needs_hits")
    finally:
        del registry._REGISTRY["advantage"]["test/needs_hits"]
    # hapo_clip reads the policy's entropy, which the update computes: nothing is missing.
    validate(apply_overrides(Config(), ["loss=hapo_clip"]))
    # hapo's `lengths` comes from the batch: nothing is missing.
    validate(apply_overrides(Config(), ["advantage=hapo", "loss_kwargs={'eps_high': 0.28}", "advantage_kwargs.eps=1e-5"]))


@pytest.mark.parametrize("override, needle", [
    ("advantage=grpp", "advantage='grpp' is not a registered advantage kernel; valid names: "),
    ("loss=ppo", "loss='ppo' is not a registered loss kernel; valid names: "),
    ("loss_mask=pivot", "loss_mask='pivot' is not a registered mask kernel; valid names: "),
    ("aggregation=mean", "aggregation='mean' is not an aggregation mode; valid modes: token_mean, "),
    ("kl_kind=k4", "kl_kind='k4' is not a registered kl kernel; valid names: abs, abs+, k1, k1+, k2, k3, "),
    ("kl_kwargs.clip=10", "kl_kwargs key 'clip' is not an argument of kl_kind 'k3'; valid keys: clamp"),
])
def test_unknown_kernel_names_list_the_valid_ones(override, needle):
    assert needle in _rejected(override)


def test_misspelt_field_names_the_closest_one():
    """`c.group_sise = 4` used to be kept as a new attribute that nothing read."""
    cfg = Config()
    with pytest.raises(AttributeError, match=r"^Config has no field 'group_sise'; did you mean 'group_size'\?$"):
        cfg.group_sise = 4
    with pytest.raises(AttributeError, match=r"^SamplingConfig has no field 'temprature'; did you mean 'temperature'\?$"):
        cfg.sampling.temprature = 0.7
    with pytest.raises(AttributeError, match="MeshConfig has no field 'zzz'; valid fields: data, fsdp, model"):
        cfg.mesh.zzz = 2
    assert not hasattr(cfg, "group_sise")


def test_configs_still_copy_pickle_and_replace():
    cfg = apply_overrides(Config(), ["optimizer.lr=2e-6", "loss_kwargs.eps_high=0.28", "group_size=4"])
    expected = dataclasses.asdict(cfg)
    for twin in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert dataclasses.asdict(twin) == expected
        twin.group_size = 2  # assignment of real fields still works on the copies
    replaced = dataclasses.replace(cfg, group_size=2)
    assert replaced.group_size == 2 and replaced.optimizer.lr == 2e-6 and cfg.group_size == 4


def _experiment(tmp_path, body, name="x.py"):
    path = tmp_path / name
    path.write_text("from jaxgrpo.config import Config\n\n\ndef config():\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return str(path)


def test_misspelt_field_in_an_experiment_file_points_at_its_line(tmp_path):
    path = _experiment(tmp_path, "c = Config()\nc.group_sise = 4\nreturn c\n")
    with pytest.raises(ExperimentError) as error:
        load_experiment(path)
    assert str(error.value) == (f"{path} line 6: AttributeError: Config has no field 'group_sise'; "
                                "did you mean 'group_size'?")


def test_syntax_error_in_an_experiment_file_is_one_line(tmp_path):
    path = _experiment(tmp_path, "c = Config()\nc.group_size = = 4\nreturn c\n")
    with pytest.raises(ExperimentError) as error:
        load_experiment(path)
    assert str(error.value) == f"{path} line 6: invalid syntax"


def test_error_raised_in_config_names_its_type_and_line(tmp_path):
    path = _experiment(tmp_path, "c = Config()\nc.group_size = {'a': 4}['b']\nreturn c\n")
    with pytest.raises(ExperimentError) as error:
        load_experiment(path)
    assert str(error.value) == f"{path} line 6: KeyError: 'b'"
    assert isinstance(error.value.__cause__, KeyError)  # the original stays attached for debugging


CLI_CASES = {
    "temperature": (["--set", "sampling.temperature=0"], "sampling.temperature must be > 0 for training"),
    "lr": (["--set", "optimizer.lr=-1"], "optimizer.lr must be > 0"),
    "top_p": (["--set", "sampling.top_p=1.5"], "sampling.top_p must be in (0, 1]"),
    "max_new_tokens": (["--set", "sampling.max_new_tokens=0"], "sampling.max_new_tokens must be >= 1"),
    "loss_kwargs": (["--set", "loss_kwargs.eps_hgih=0.28"], "loss_kwargs key 'eps_hgih' is not an argument of loss 'ppo_clip'"),
    "advantage_kwargs": (["--set", "advantage_kwargs.std_dof=0"], "advantage_kwargs key 'std_dof'"),
    "num_minibatches": (["--set", "num_minibatches=0"], "num_minibatches must be >= 1"),
    "num_epochs": (["--set", "num_epochs=0"], "num_epochs must be >= 1"),
    "advantage": (["--set", "advantage=grpp"], "advantage='grpp' is not a registered advantage kernel"),
    "loss": (["--set", "loss=ppo"], "loss='ppo' is not a registered loss kernel"),
    "loss_mask": (["--set", "loss_mask=pivot"], "loss_mask='pivot' is not a registered mask kernel"),
    "aggregation": (["--set", "aggregation=mean"], "aggregation='mean' is not an aggregation mode"),
    "kl_kind": (["--set", "kl_kind=k4"], "kl_kind='k4' is not a registered kl kernel"),
    "group_size=1": (["--set", "group_size=1"], "group_size=1 with advantage='grpo': a group-relative advantage "
                     "compares each completion with the others of its prompt"),
    "misspelt field": ("c.group_sise = 4", "x.py line 7: AttributeError: Config has no field 'group_sise'; did you mean 'group_size'?"),
    "syntax error": ("c.group_size = = 4", "x.py line 7: invalid syntax"),
    "error in config()": ("c.group_size = {'a': 4}['b']", "x.py line 7: KeyError: 'b'"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_rejects_mistakes_in_one_line_before_building_anything(case, tmp_path, monkeypatch, capsys):
    import jaxgrpo.train.loop
    from jaxgrpo.tools.cli import train_main

    def no_trainer(*args, **kwargs):
        raise AssertionError("the Trainer was built for a config that should have been rejected")

    monkeypatch.setattr(jaxgrpo.train.loop, "Trainer", no_trainer)
    monkeypatch.chdir(tmp_path)
    given, needle = CLI_CASES[case]
    if isinstance(given, str):  # a line of the experiment file, after `c = Config()`
        argv = [_experiment(tmp_path, f"c = Config()\nc.steps = 1\n{given}\nreturn c\n")]
    else:
        argv = [os.path.join(ROOT, "experiments", "grpo.py"), *given]
    assert train_main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error: "), lines
    assert needle in lines[0], lines[0]
    assert out == "" and not (tmp_path / "runs").exists()  # no run directory either


def test_packing_defaults_per_platform_as_measured_and_an_explicit_value_is_kept():
    from jaxgrpo.config import PACKING_BY_PLATFORM, resolve_packing

    cfg = Config()
    assert cfg.packing is None  # the platform's default
    assert resolve_packing(cfg, "cpu").packing is True and resolve_packing(cfg, "tpu").packing is True
    assert resolve_packing(cfg, "gpu").packing is False  # docs/gpu.md: the packed update was slower on an H100
    assert cfg.packing is None  # the given config is not changed
    assert PACKING_BY_PLATFORM == {"cpu": True, "gpu": False, "tpu": True}
    for value in (True, False):
        explicit = apply_overrides(Config(), [f"packing={str(value).lower()}"])
        assert all(resolve_packing(explicit, p).packing is value for p in ("cpu", "gpu", "tpu"))
