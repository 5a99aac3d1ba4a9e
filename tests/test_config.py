"""The config system: experiment files, command-line overrides and their errors."""

import os
import subprocess
import sys

import pytest

from jaxgrpo.config import Config, apply_overrides, load_experiment, valid_keys, validate

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


def test_cli_errors_are_one_line(tmp_path):
    """A typo in --set exits 2 with a single error line naming the key and the valid ones."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxgrpo.cli", os.path.join(ROOT, "experiments", "grpo.py"), "--set", "optimzer.lr=1"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown config key 'optimzer.lr'" in lines[0] and "optimizer.lr" in lines[0]
    proc = subprocess.run([sys.executable, "-m", "jaxgrpo.cli", str(tmp_path / "nope.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and "not found" in proc.stderr
