"""The config system: experiment files, command-line overrides and their errors."""

import copy
import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from jaxgrpo.config import Config, ExperimentError, apply_overrides, load_experiment, valid_keys, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py"))


def test_overrides_set_nested_typed_fields():
    cfg = apply_overrides(Config(), ["optimizer.lr=1e-6", "group_size=8", "dynamic_sampling=true",
                                      "loss_kwargs.eps_high=0.28", "aggregation_max_len=none", "task.name=gsm8k"])
    assert cfg.optimizer.lr == 1e-6 and isinstance(cfg.optimizer.lr, float)
    assert cfg.group_size == 8 and isinstance(cfg.group_size, int)
    assert cfg.dynamic_sampling is True
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
    return subprocess.run([sys.executable, "-m", "jaxgrpo.cli", *args], capture_output=True, text=True, cwd=cwd)


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
