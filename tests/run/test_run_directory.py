"""What a run does with its directory when a user's input is wrong or the machine fails: refuses to overwrite,
one writer at a time, resume only with a compatible config, falls back past a damaged checkpoint, survives a
torn metrics line, reports a full or read-only disk in one line, and stops a run that trains nothing."""

import errno
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import jaxgrpo.rewards
import jaxgrpo.train.loop
from jaxgrpo.config import Config, apply_overrides, load_experiment, validate
from jaxgrpo.run.checkpoint import CheckpointError, Checkpointer
from jaxgrpo.run.metrics import MetricsWriter, read_jsonl
from jaxgrpo.run.rundir import RunDirectory, RunDirectoryError
from jaxgrpo.tools.cli import plot_main, train_main
from jaxgrpo.train import NoLearningSignal, NonFiniteUpdates, Trainer
from tests.support import processes
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOY = os.path.join(ROOT, "experiments", "toy_sum.py")
# A 2-step toy run, a checkpoint at each step.
SMALL = ["steps=2", "checkpoint_every=1", "warmup_sft_steps=0", "eval_every=0", "task.num_eval_examples=0",
         "prompts_per_step=4", "group_size=4", "sampling.max_new_tokens=2"]


def toy_config(run_dir, *overrides):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [*SMALL, f"run_dir={run_dir}", *overrides])
    return cfg


def steps_of(run_dir, file="metrics.jsonl"):
    return [r["step"] for r in read_jsonl(os.path.join(run_dir, file))]


def params_of(trainer):
    return jax.tree.map(np.asarray, trainer.state.params)


def one_error_line(capsys):
    """The one line the CLI wrote to stderr besides its progress bar."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(a finished 2-step run directory, its trainer, its final parameters); tests copy the directory.

    Tests reuse the trainer (its compiled programs) by pointing its config at their copy; `restore`
    and `run` set everything a run depends on (state, data position, key).
    """
    run_dir = str(tmp_path_factory.mktemp("finished") / "run")
    trainer = Trainer(toy_config(run_dir))
    trainer.run(progress=False)
    return run_dir, trainer, params_of(trainer)


@pytest.fixture
def copy_of(finished, tmp_path):
    run_dir, trainer, params = finished
    base = trainer.cfg

    def copy(name="run", **changes):
        target = str(tmp_path / name)
        shutil.copytree(run_dir, target)
        trainer.cfg = toy_config(target)
        for key, value in changes.items():
            setattr(trainer.cfg, key, value)
        return target, trainer

    yield copy
    trainer.cfg = base


def test_a_fresh_run_into_a_used_directory_is_refused_unless_overwrite(copy_of, capsys, monkeypatch):
    """Before: orbax skipped every save (a step at or below its latest) and metrics.jsonl read 1,2,1,2."""
    run_dir, trainer = copy_of()
    config_before = open(os.path.join(run_dir, "config.json")).read()
    with pytest.raises(RunDirectoryError, match=r"already holds a run .*--resume to continue it, --overwrite to "
                                                r"delete it and start over, or another --run-dir"):
        trainer.run(progress=False)
    with monkeypatch.context() as patch:  # the CLI refuses before it builds the model
        patch.setattr(jaxgrpo.train.loop, "Trainer", lambda *a, **k: pytest.fail("the Trainer was built"))
        assert train_main([TOY, "--run-dir", run_dir, "--set", *SMALL]) == 1
    assert "already holds a run" in one_error_line(capsys)
    assert steps_of(run_dir) == [1, 2] and open(os.path.join(run_dir, "config.json")).read() == config_before

    open(os.path.join(run_dir, "eval_test_step2.jsonl"), "w").close()  # jaxgrpo-eval's output: a run file
    trainer.run(overwrite=True, progress=False)
    assert steps_of(run_dir) == [1, 2] and not os.path.exists(os.path.join(run_dir, "eval_test_step2.jsonl"))
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["1", "2"]
    with pytest.raises(RunDirectoryError, match="contradict"):
        trainer.run(resume=True, overwrite=True, progress=False)

    # A save that orbax skips is an error, not silence.
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"))
    with pytest.raises(CheckpointError, match="orbax did not save step 1 .* already holds step 2"):
        checkpointer.save(1, {"x": np.zeros(2)}, {})
    checkpointer.close()


def test_overwrite_deletes_only_a_run_directory_and_nothing_of_a_users(copy_of, tmp_path, capsys, monkeypatch):
    """Before: `--overwrite` into a folder holding a thesis deleted it all, and a run directory with a user's
    notes in it lost them."""
    thesis = tmp_path / "thesis"
    (thesis / "figures").mkdir(parents=True)
    (thesis / "thesis.tex").write_text("\\section{Results}")
    (thesis / "figures" / "curve.pdf").write_text("%PDF")
    with monkeypatch.context() as patch:  # refused before the model is built
        patch.setattr(jaxgrpo.train.loop, "Trainer", lambda *a, **k: pytest.fail("the Trainer was built"))
        assert train_main([TOY, "--run-dir", str(thesis), "--overwrite", "--set", *SMALL]) == 1
    line = one_error_line(capsys)
    assert "holds 2 entries no run wrote (figures, thesis.tex)" in line and "nothing was deleted" in line
    assert "another --run-dir" in line
    assert (thesis / "thesis.tex").read_text() == "\\section{Results}" and (thesis / "figures" / "curve.pdf").exists()

    # A run directory with a file of the user's beside the run's is refused whole too: nothing is deleted.
    run_dir, trainer = copy_of()
    (open(os.path.join(run_dir, "notes.txt"), "w")).write("keep me")
    with pytest.raises(RunDirectoryError, match=r"holds 1 entry no run wrote \(notes.txt\)"):
        trainer.run(overwrite=True, progress=False)
    assert open(os.path.join(run_dir, "notes.txt")).read() == "keep me" and steps_of(run_dir) == [1, 2]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["1", "2"]


def test_export_refuses_a_non_empty_out_unless_overwrite_and_then_replaces_only_its_files(finished, tmp_path, capsys):
    """Before: a second export silently replaced the first's config.json and model.safetensors."""
    pytest.importorskip("transformers")
    from jaxgrpo.tools.cli import export_main

    run_dir, _, _ = finished
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{\"another\": \"export\"}")
    (out / "model.safetensors").write_bytes(b"another export's weights")
    (out / "README.md").write_text("my model card")
    assert export_main([run_dir, "--out", str(out), "--step", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxgrpo-export: error: --out ") and "is not empty" in err[0], err
    assert "--overwrite" in err[0]
    assert (out / "config.json").read_text() == "{\"another\": \"export\"}"
    assert (out / "model.safetensors").read_bytes() == b"another export's weights"

    assert export_main([run_dir, "--out", str(out), "--step", "1", "--overwrite"]) == 0
    capsys.readouterr()
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert (out / "model.safetensors").read_bytes() != b"another export's weights"
    assert (out / "README.md").read_text() == "my model card"  # not a file an export writes: kept


_HOLDER = """
import sys, time
from jaxgrpo.run.rundir import RunDirectory
run_directory = RunDirectory.open(sys.argv[1], {}, resume=True)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_writer_fails_at_once_naming_the_holder_and_a_killed_holder_frees_the_directory(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, run_dir], stdout=subprocess.PIPE, text=True,
                              env=processes.child_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        assert train_main([TOY, "--run-dir", run_dir, "--set", *SMALL]) == 1
        line = one_error_line(capsys)
        assert f"in use by pid {holder.pid} on host " in line and "run.lock" in line and "--run-dir" in line
        assert time.monotonic() - started < 60  # at once: no training, no waiting for the lock
        assert not os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's flock; its pid is still in the lock file, and is replaced.
    with RunDirectory.open(run_dir, {}, resume=True):
        assert open(os.path.join(run_dir, "run.lock")).read().startswith(f"pid {os.getpid()} on host ")


def test_resume_refuses_a_changed_config_naming_each_change_and_keeps_the_saved_config(copy_of, finished, capsys):
    run_dir, trainer = copy_of()
    config_path = os.path.join(run_dir, "config.json")
    saved = open(config_path).read()
    changed = ["group_size=2", "seed=7", "optimizer.lr=0.01"]
    assert train_main([TOY, "--run-dir", run_dir, "--resume", "--set", *SMALL, *changed]) == 1
    line = one_error_line(capsys)
    for change in ("group_size 4 -> 2", "seed 0 -> 7", "optimizer.lr 0.001 -> 0.01"):
        assert change in line, line
    assert "steps" in line and "another --run-dir" in line
    assert open(config_path).read() == saved  # the checkpoints' config survives the refused resume

    # Training longer, evaluating and keeping more checkpoints are allowed; config.json then says so.
    trainer.cfg.steps, trainer.cfg.keep_checkpoints, trainer.cfg.log_every = 3, 4, 2
    trainer.run(resume=True, progress=False)
    assert steps_of(run_dir) == [1, 2, 3]
    assert json.load(open(config_path))["steps"] == 3


def _damage(run_dir, step, how):
    state = os.path.join(run_dir, "checkpoints", str(step), "state")
    data = [f for f in glob.glob(os.path.join(state, "**", "d", "*"), recursive=True) if os.path.isfile(f)]
    if how == "truncated data":
        biggest = max(data, key=os.path.getsize)
        os.truncate(biggest, os.path.getsize(biggest) // 2)
    elif how == "deleted data":
        for f in data:
            os.remove(f)
    elif how == "deleted metadata":
        os.remove(os.path.join(state, "_METADATA"))


def test_resume_falls_back_past_damaged_checkpoints_with_one_warning(copy_of, finished, caplog, capsys):
    """Before: 44-531 lines of orbax traceback, and the previous good checkpoint was never used."""
    _, _, final_params = finished
    for i, how in enumerate(("truncated data", "deleted data", "deleted metadata")):
        run_dir, trainer = copy_of(f"run{i}")
        _damage(run_dir, 2, how)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            history = trainer.run(resume=True, progress=False)
        warnings = [r.getMessage() for r in caplog.records if "did not restore" in r.getMessage()]
        assert len(warnings) == 1 and "resumed from step 1: step 2: " in warnings[0], (how, warnings)
        # Nothing is deleted: the damaged checkpoint is set aside beside the checkpoints.
        assert "checkpoints_damaged" in warnings[0]
        assert os.listdir(os.path.join(run_dir, "checkpoints_damaged")) == ["2"]
        assert [r["step"] for r in history] == [2] and steps_of(run_dir) == [1, 2]
        # Step 2 again from checkpoint 1: the same parameters as the undamaged run's.
        jax.tree.map(np.testing.assert_array_equal, final_params, params_of(trainer))
        assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["1", "2"]

    run_dir, _ = copy_of("none_restores")
    _damage(run_dir, 1, "deleted metadata")
    _damage(run_dir, 2, "deleted data")
    assert train_main([TOY, "--run-dir", run_dir, "--resume", "--set", *SMALL]) == 1
    line = one_error_line(capsys)
    assert "no checkpoint in" in line and "restores (step 2: CheckpointDamaged: checkpoint of step 2 in " in line
    assert "is damaged: its array data could not be read (ValueError: NOT_FOUND" in line and "; step 1: " in line
    assert "--overwrite" in line


def _flip_bytes(run_dir, step):
    """Flips a byte in the middle of each array data file of a checkpoint bigger than 1 kB (the parameters' and
    the optimizer moments'): the files keep their size, and orbax reads them back without a complaint."""
    data = glob.glob(os.path.join(run_dir, "checkpoints", str(step), "state", "ocdbt.process_*", "d", "*"))
    flipped = [f for f in data if os.path.getsize(f) > 1024]
    for path in flipped:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0x5A]))
    assert len(flipped) >= 2, data


#: What a flipped byte does, by where it lands in an array's compressed data (which depends on the trained numbers,
#: and so on the machine code): the array reads back wrong, or its data no longer decodes.
_DAMAGED = ("does not match the checksum saved with it", "is damaged: its array data could not be read")


def test_a_checkpoint_with_flipped_bytes_is_refused_by_resume_eval_and_export(copy_of, finished, caplog, capsys):
    """Before: the flipped bytes restored without a word; training went on from wrong numbers (NaN in the toy's
    case), jaxgrpo-eval reported the damaged policy's accuracy and jaxgrpo-export wrote its weights, all exit 0."""
    from jaxgrpo.tools.cli import eval_main, export_main

    _, _, final_params = finished
    run_dir, trainer = copy_of("resumed")
    _flip_bytes(run_dir, 2)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        history = trainer.run(resume=True, progress=False)
    warnings = [r.getMessage() for r in caplog.records if "did not restore" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "resumed from step 1: step 2: CheckpointDamaged: checkpoint of step 2 in " in warnings[0]
    assert any(why in warnings[0] for why in _DAMAGED), warnings[0]
    assert os.listdir(os.path.join(run_dir, "checkpoints_damaged")) == ["2"]
    # Step 2 trained again from checkpoint 1: the undamaged run's parameters, bit for bit.
    assert [r["step"] for r in history] == [2]
    jax.tree.map(np.testing.assert_array_equal, final_params, params_of(trainer))

    run_dir, _ = copy_of("read_back")
    _flip_bytes(run_dir, 2)
    out = os.path.join(run_dir, "..", "hf")
    for main, argv in ((eval_main, ["--num", "4", "--k", "1"]), (export_main, ["--out", out])):
        assert main([run_dir, "--step", "2", *argv]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and ": error: checkpoint of step 2 in " in lines[0], lines
        assert any(why in lines[0] for why in _DAMAGED) and "pass --step with another of its checkpoints (steps: 1)" in lines[0]
    assert not os.path.exists(out) and not glob.glob(os.path.join(run_dir, "eval_*"))


def test_a_torn_last_metrics_line_is_skipped_by_readers_and_dropped_by_resume(copy_of, caplog, capsys):
    """Before: a JSONDecodeError blocked both --resume and jaxgrpo-plot."""
    run_dir, trainer = copy_of(steps=3)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    with open(metrics, "a") as f:
        f.write('{"step": 3, "reward_me')  # a crash while step 3's line was written
    with caplog.at_level(logging.WARNING):
        assert steps_of(run_dir) == [1, 2]
        assert plot_main([run_dir]) == 0
    assert "reward.png" in capsys.readouterr().out
    torn = [r for r in caplog.records if "cut short" in r.getMessage()]
    assert len(torn) == 2 and '{"step": 3, "reward_me' in torn[0].getMessage()  # one per read

    trainer.run(resume=True, progress=False)
    lines = open(metrics).read().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # every line whole

    with open(metrics, "r+") as f:  # damage before the last line is not a torn write: an error naming it
        f.write("garbage\n")
    with pytest.raises(ValueError, match="metrics.jsonl, line 1, is not a JSON record"):
        read_jsonl(metrics)


def test_a_metrics_line_is_one_write(tmp_path, monkeypatch):
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    writer = MetricsWriter(str(tmp_path), tensorboard=False, enabled=True)
    writer.write(1, {f"metric_{i}": float(i) for i in range(2000)})  # ~40 kB: more than a write buffer
    monkeypatch.undo()
    (line,) = writes
    assert line.endswith(b"\n") and json.loads(line)["metric_1999"] == 1999.0


def test_a_full_disk_during_a_save_and_a_read_only_directory_are_one_line_errors(tmp_path, capsys, monkeypatch):
    """Before: 589 lines of traceback for a disk that filled during a save; earlier checkpoints must survive."""
    run_dir = str(tmp_path / "run")
    handler_save = ocp.StandardCheckpointHandler.async_save
    calls = []

    def disk_fills_at_second_save(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(run_dir, "checkpoints"))
        return handler_save(self, *args, **kwargs)

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", disk_fills_at_second_save)
    assert train_main([TOY, "--run-dir", run_dir, "--set", *SMALL]) == 1
    line = one_error_line(capsys)
    assert f"could not save the checkpoint of step 2 in {run_dir}/checkpoints" in line
    assert "No space left on device" in line and "rerun with --resume" in line
    monkeypatch.undo()  # space freed
    assert train_main([TOY, "--run-dir", run_dir, "--resume", "--set", *SMALL]) == 0
    capsys.readouterr()
    assert steps_of(run_dir) == [1, 2]  # step 2 again from the surviving checkpoint 1

    # tensorstore reports a full disk as a ValueError naming the OS error code; that is a storage failure too.
    from jaxgrpo.run.checkpoint import storage_failure

    tensorstore_error = ValueError("RESOURCE_EXHAUSTED: Error writing local file \"x\": Failed to write 83 bytes to "
                                   "file 8: No space left on device [os_error_code='28']")
    assert storage_failure(tensorstore_error) == "No space left on device (errno ENOSPC)"

    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        open(read_only / "probe", "w").close()
        writable = True  # root ignores the mode: inject the error the kernel would give instead
    except PermissionError:
        writable = False
    if writable:
        os.remove(read_only / "probe")
        real_open = os.open

        def refuse(path, *args, **kwargs):
            if str(path).startswith(str(read_only)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    try:
        assert train_main([TOY, "--run-dir", str(read_only), "--set", *SMALL]) == 1
    finally:
        monkeypatch.undo()
        read_only.chmod(0o755)
    line = one_error_line(capsys)
    assert f"cannot write the run directory {read_only}: Permission denied" in line and "make it writable" in line


def nan_reward(completions, examples):
    return np.full(len(completions), np.nan, np.float32)


def test_a_run_that_trains_no_row_warns_each_step_and_stops(tmp_path, capsys, caplog, monkeypatch):
    """Before: a NaN reward on every sample trained nothing for the whole run, and it exited 0 without a word."""
    monkeypatch.setattr(jaxgrpo.rewards, "nan_reward", nan_reward, raising=False)
    run_dir = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        code = train_main([TOY, "--run-dir", run_dir, "--set", *SMALL, "steps=5", "max_steps_without_signal=3",
                           "rewards={'nan_reward': 1.0}", "correctness_reward=nan_reward"])
    assert code == 1
    line = one_error_line(capsys)
    assert "steps 1-3 trained no row" in line and "max_steps_without_signal=0" in line
    warned = [r.getMessage() for r in caplog.records if "trained no row" in r.getMessage()]
    assert [w.split(" trained")[0] for w in warned] == ["step 1", "step 2"]
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["frac_trained_rows"] == 0 for r in records)

    cfg = Config()
    cfg.max_steps_without_signal = -1
    with pytest.raises(ValueError, match="max_steps_without_signal must be >= 0"):
        validate(cfg)


def nan_advantages(monkeypatch, steps):
    """Makes the advantages of the given steps' batches (counted from 1 in this process) NaN: their loss and
    gradient are NaN, as an overflow or a NaN reward that slipped through would make them."""
    calls = []
    real = Trainer.advantages

    def advantages(self, state, rollout, stats=None, metrics=None):
        batch = real(self, state, rollout, stats, metrics)
        calls.append(1)
        return batch._replace(advantages=np.full_like(batch.advantages, np.nan)) if len(calls) in steps else batch

    monkeypatch.setattr(Trainer, "advantages", advantages)


def test_a_non_finite_update_is_skipped_keeping_the_state_bit_for_bit_and_counted(copy_of, monkeypatch, caplog):
    """Before: a NaN gradient was applied, every weight went NaN, and the run trained on NaN to its end, exit 0."""
    run_dir, trainer = copy_of(steps=3)
    nan_advantages(monkeypatch, steps={2})
    states = {}
    on_step = lambda step, record: states.__setitem__(step, jax.tree.map(np.array, trainer.state))  # noqa: E731
    with caplog.at_level(logging.WARNING):
        history = trainer.run(overwrite=True, progress=False, on_step=on_step)
    assert [r["skipped_nonfinite"] for r in history] == [0, 1, 0]
    assert np.isnan(history[1]["loss"]) and np.isfinite(history[2]["loss"])
    # Step 2's update was not applied: parameters, optimizer state and step counter as after step 1, bit for bit.
    jax.tree.map(np.testing.assert_array_equal, states[1], states[2])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(states[3].params))
    assert not np.array_equal(jax.tree.leaves(states[2].params)[0], jax.tree.leaves(states[3].params)[0])
    warned = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("step 2: 1 of 1 update(s) not applied: loss nan"), warned
    assert "1 such step(s) in a row, the run stops at 3" in warned[0]


def test_consecutive_non_finite_steps_stop_the_run(tmp_path, capsys, monkeypatch, caplog):
    run_dir = str(tmp_path / "run")
    nan_advantages(monkeypatch, steps={1, 2, 3, 4})
    with caplog.at_level(logging.WARNING):
        code = train_main([TOY, "--run-dir", run_dir, "--set", *SMALL, "steps=4", "max_nonfinite_steps=2"])
    assert code == 1
    line = one_error_line(capsys)
    assert "steps 1-2 each had an update with a non-finite loss, gradient or result" in line
    assert "max_nonfinite_steps=0" in line and "optimizer.lr" in line
    assert [r.getMessage().split(":")[0] for r in caplog.records if "not applied" in r.getMessage()] == ["step 1"]
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [(r["step"], r["skipped_nonfinite"]) for r in records] == [(1, 1), (2, 1)]

    cfg = Config()
    cfg.max_nonfinite_steps = -1
    with pytest.raises(ValueError, match=r"max_nonfinite_steps must be >= 0 \(0 = never stop\)"):
        validate(cfg)


def same_reward(completions, examples):
    return np.ones(len(completions), np.float32)


def test_a_run_whose_advantages_are_all_zero_warns_each_step_and_stops(tmp_path, capsys, caplog, monkeypatch):
    """Before: a reward equal for every completion trained every row with advantage 0 (grad_norm 0.0) for the whole
    run, and it exited 0 without a word."""
    monkeypatch.setattr(jaxgrpo.rewards, "same_reward", same_reward, raising=False)
    run_dir = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        code = train_main([TOY, "--run-dir", run_dir, "--set", *SMALL, "steps=4", "max_steps_without_signal=2",
                           "rewards={'same_reward': 1.0}", "correctness_reward=same_reward"])
    assert code == 1
    line = one_error_line(capsys)
    assert "steps 1-2 trained only rows whose advantage is zero (2 in a row, max_steps_without_signal=2)" in line
    assert "the rewards were equal within every group" in line and "max_steps_without_signal=0" in line
    warned = [r.getMessage() for r in caplog.records if "advantage is zero" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("step 1 trained only rows whose advantage is zero"), warned
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["frac_trained_rows"] == 1 and r["frac_signal_rows"] == 0 and r["grad_norm"] == 0 for r in records)
