"""The compile report says what its figures are and how far a measured run was from them; a program that does not
fit the device is one line naming it, what it needs and what to change.

* `count_products`'s memory-bound work: golden byte counts of element-wise results, in-place updates and scans;
* `jaxgrpo.tools.calibration`: the committed H200 rows' factors, device-check results read (and their absence, or
  damage, tolerated), the nearest row chosen by chip, platform and layout, the note a TPU report prints;
* the printed report and the documentation never call an estimate plain "MFU";
* XLA's RESOURCE_EXHAUSTED (messages as XLA writes them on a GPU, a CPU and a TPU) from the update, the sampler
  or the scoring forward becomes `OutOfDeviceMemory`, one line with the original chained, and `jaxgrpo-train`
  prints that one line and exits 1.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re

import jax
import jax.numpy as jnp
import pytest

from jaxgrpo.config import apply_overrides, load_experiment
from jaxgrpo.errors import OutOfDeviceMemory, requested_bytes
from jaxgrpo.tools import calibration, cli
from jaxgrpo.tools import compile as aot
from jaxgrpo.train import device_memory
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOY = os.path.join(ROOT, "experiments", "toy_sum.py")
MiB, GiB = 1 << 20, 1 << 30
# A toy run as small as it gets, its 8 rows split over the 8 fake devices of tests/conftest.py.
SMALL = ["steps=1", "warmup_sft_steps=0", "eval_every=0", "task.num_eval_examples=0", "prompts_per_step=4",
         "group_size=2", "sampling.max_new_tokens=2"]


# -- the memory-bound work -------------------------------------------------------------------------------------


def test_memory_bound_work_counts_each_big_result_once_times_the_trip_count():
    """Golden: per scan iteration, exp and mul each write an f32[512, 1024] (2 MiB), slicing 256 rows of it writes
    1 MiB and the in-place update writes those 1 MiB into the carry; the broadcast, the product (counted as a
    product) and the scalar sums move nothing counted. Three iterations: 3 x 6 MiB."""
    def body(carry, weight):
        y = jnp.exp(carry) * 2.0
        spread = jnp.broadcast_to(y[None], (2, 512, 1024))
        updated = jax.lax.dynamic_update_slice(carry, y[:256], (0, 0))
        return updated, spread.sum() + (y @ weight).sum()

    jaxpr = jax.make_jaxpr(lambda x, w: jax.lax.scan(body, x, w))(jnp.ones((512, 1024)), jnp.ones((3, 1024, 1024)))
    count = aot.count_products(jaxpr, peak_flops=1e12, hbm_bandwidth=1e9)
    assert count.memory_bound_bytes == 3 * 6 * MiB
    assert count.memory_bound_seconds == pytest.approx(3 * 6 * MiB / 1e9)
    assert count.with_memory_seconds == pytest.approx(count.roofline_seconds + count.memory_bound_seconds)
    assert count.flops == 3 * 2 * 512 * 1024 * 1024  # the products are counted as before
    # Below min_bytes a result stays in caches: nothing counted.
    assert aot.count_products(jaxpr, 1e12, 1e9, min_bytes=4 * MiB).memory_bound_bytes == 0


def test_memory_bound_work_of_a_branch_is_its_largest():
    def branches(x, which):
        return jax.lax.cond(which, lambda v: jnp.exp(v), lambda v: jnp.tanh(jnp.exp(v)), x)

    count = aot.count_products(jax.make_jaxpr(branches)(jnp.ones((512, 1024)), True), 1e12, 1e9)
    assert count.memory_bound_bytes == 2 * 2 * MiB  # the second branch: two results of 2 MiB


# -- calibration rows --------------------------------------------------------------------------------------------


def test_the_committed_h200_runs_give_their_measured_over_estimated_factors():
    off, on = (calibration.nearest(calibration.MEASURED, "NVIDIA H200", "update", packing) for packing in (False, True))
    assert off.factor == pytest.approx(1.96 / 0.649) and f"{off.factor:.1f}" == "3.0"
    assert on.factor == pytest.approx(5.85 / 1.196) and f"{on.factor:.1f}" == "4.9"
    # The memory-bound work closes most of the gap, in both layouts.
    assert 1.2 < off.factor_with_memory < 1.4 and 1.2 < on.factor_with_memory < 1.4
    for row in (off, on):
        assert row.jax_version == "0.11.2" and row.date and "Qwen3-0.6B" in row.configuration


def test_device_check_results_add_rows_and_their_absence_or_damage_is_tolerated(tmp_path):
    (tmp_path / "device_check_h100.json").write_text(json.dumps({
        "chip": "NVIDIA H100 80GB HBM3", "jax_version": "0.11.2", "date": "2026-12-01",
        "update": {"packing_off": {"seconds": 1.5, "estimate_seconds": 0.5, "estimate_with_memory_seconds": 1.25},
                   "packing_on": {"seconds": 3.0, "estimate_seconds": 1.0}},
        "forward": {"seconds": 0.2, "estimate_seconds": 0.1}}))
    # benchmarks/device_check.py's form: the update's rows under "train", the chip and jax under "env".
    (tmp_path / "device_check_tpu_v5e.json").write_text(json.dumps({
        "env": {"chip": "TPU v5 lite", "jax": "0.10.2"}, "date": "2026-12-02", "model": "random-qwen3-0.6b",
        "matmul": {"peak_flops": 1.9e14, "bandwidth": 8e11},
        "train": {"packing_on": {"update_seconds": 4.0, "estimate_seconds": 2.0, "packing": True},
                  "packing_off": {"error": "RESOURCE_EXHAUSTED: ..."}}}))
    (tmp_path / "device_check_small.json").write_text(json.dumps({"small": True, "env": {"chip": "cpu"},
                                                                  "train": {"packing_on": {"update_seconds": 1,
                                                                                           "estimate_seconds": 1}}}))
    (tmp_path / "device_check_broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"chip": "x", "update": {"seconds": 1, "estimate_seconds": 1}}))
    rows = calibration.load([str(tmp_path), str(tmp_path / "absent")])
    added = rows[len(calibration.MEASURED):]
    assert rows[:len(calibration.MEASURED)] == list(calibration.MEASURED)
    assert sorted((r.chip, r.program, r.packing, r.factor) for r in added) == [
        ("NVIDIA H100 80GB HBM3", "forward", None, 2.0), ("NVIDIA H100 80GB HBM3", "update", False, 3.0),
        ("NVIDIA H100 80GB HBM3", "update", True, 3.0), ("TPU v5 lite", "update", True, 2.0)]
    h100 = next(r for r in added if r.packing is False)
    assert h100.factor_with_memory == 1.2 and h100.source.endswith("device_check_h100.json")
    tpu = next(r for r in added if r.chip.startswith("TPU"))
    assert tpu.peak_flops == 1.9e14 and tpu.jax_version == "0.10.2" and tpu.factor_with_memory is None
    assert calibration.load([]) == list(calibration.MEASURED)


def test_the_nearest_run_is_the_same_chip_then_platform_then_a_gpu_and_the_note_says_which():
    rows = [*calibration.MEASURED,
            calibration.Calibration("NVIDIA H100", "0.11.2", "update", "c", 2.0, 1.0, "2026-12-01", False)]
    # A TPU with no TPU run: the GPU runs, of the same layout, the one with the memory estimate first.
    assert calibration.nearest(rows, "TPU v5e", "update", True).measured_seconds == 5.85
    assert calibration.nearest(rows, "TPU v5e", "update", False).chip == "NVIDIA H200"
    assert calibration.nearest(rows, "NVIDIA H100", "update", True).chip == "NVIDIA H100"
    assert calibration.nearest(rows, "TPU v5e", "decode") is None
    tpu_row = calibration.Calibration("TPU v5e", "0.10.2", "update", "c", 3.0, 1.0, "2026-12-01", True)
    assert calibration.nearest([*rows, tpu_row], "TPU v5p", "update", False) is tpu_row  # the same platform first
    h200 = calibration.nearest(rows, "TPU v5e", "update", False)
    assert calibration.note(h200, "TPU v5e") == (
        "measured 3.0x this on an H200, jax 0.11.2: a GPU; no TPU run measured yet")
    assert calibration.note(h200, "NVIDIA H200", with_memory=True) == "measured 1.3x this on an H200, jax 0.11.2"
    assert calibration.note(None, "TPU v5e") == "no measured run of this program to calibrate against"
    assert calibration.note(rows[-1], "TPU v5e", with_memory=True).startswith("not calibrated: the run on an H100")


# -- the report and the pages say "estimated" ----------------------------------------------------------------


def _unqualified_mfu(text: str) -> list[str]:
    """Every "MFU" not said to be estimated or measured (or the name of the convention), with its context."""
    found = []
    for match in re.finditer(r"\bMFU\b", text):
        before, after = text[max(0, match.start() - 40):match.start()], text[match.end():match.end() + 12]
        if not re.search(r"(estimated|measured)\W*(\w+\W+){0,2}$", before) and not after.startswith(" convention"):
            found.append(text[max(0, match.start() - 40):match.end() + 12])
    return found


def _program(**fields) -> aot.ProgramReport:
    row = calibration.nearest(calibration.MEASURED, "TPU v5e", "update", False)
    base = dict(program="update", fits=True, hbm_bytes=4 * GiB, argument_bytes=GiB, output_bytes=0, temp_bytes=3 * GiB,
                alias_bytes=GiB, hbm_capacity=16 * GiB, flops=1e12, bytes_accessed=1e9, compiler_seconds=None,
                model_flops=4e14, model_flops_seconds=2.0, hbm_roofline_seconds=0.1, step_floor_seconds=None,
                program_flops=5e14, estimated_seconds=2.5, pallas_flops=0.0, pallas_seconds=0.0, mfu=0.8,
                loops_counted_once=0, largest_values=[], collectives={}, host_transfers=[], compile_seconds=1.0,
                memory_bound_bytes=GiB, memory_bound_seconds=1.5, estimated_seconds_with_memory=4.0,
                mfu_with_memory=0.5, calibration={**row._asdict(), "factor": row.factor})
    return aot.ProgramReport(**{**base, **fields})


def test_the_printed_report_labels_every_estimate_and_prints_the_measured_factor_beside_it():
    report = aot.Report("v5e:2x4", "TPU v5e", 8, 2, {"data": 8}, "toy", 1000, [_program()], "xla")
    text = report.table()
    lines = [line for line in text.splitlines() if "estimated" in line]
    assert lines == [
        "           estimated 2.50 s (roofline bound, the products alone: 5e+14 FLOPs, Pallas calls 0 FLOPs in "
        "0.0 us; measured 3.0x this on an H200, jax 0.11.2: a GPU; no TPU run measured yet); estimated MFU 80% "
        "(roofline bound)",
        "           estimated 4.00 s with the memory-bound work (roofline bound: the products and the 1.00 GiB per "
        "chip other operations move at HBM bandwidth, 1.50 s; measured 1.3x this on an H200, jax 0.11.2: a GPU; no "
        "TPU run measured yet); estimated MFU 50% (roofline bound)"]
    assert _unqualified_mfu(text) == []
    uncalibrated = aot.Report("v5e:2x4", "TPU v5e", 8, 2, {}, "toy", 1, [_program(program="decode", calibration=None,
                                                                                mfu=None, mfu_with_memory=None)], "xla")
    assert uncalibrated.table().count("no measured run of this program to calibrate against") == 2


def test_no_page_calls_an_estimate_plain_mfu():
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]
    for path in pages:
        with open(path, encoding="utf-8") as f:
            assert _unqualified_mfu(f.read()) == [], path


def test_the_tpu_page_states_the_measured_factors_and_that_no_tpu_ran():
    with open(os.path.join(ROOT, "docs", "tpu.md"), encoding="utf-8") as f:
        text = f.read()
    assert "estimated MFU (roofline bound)" in text and "no tpu run has been measured yet" in text.lower()
    rows = calibration.load([os.path.join(ROOT, "benchmarks", "results")])
    for packing in (False, True):  # the runs nearest a TPU's update, unpacked and packed, and their factors
        row = calibration.nearest(rows, "TPU", "update", packing=packing)
        assert row is not None and row.platform == "gpu"
        assert f"{row.measured_seconds:.2f} s" in text and f"{row.factor:.1f}x" in text, row


def test_the_compile_cli_reads_device_check_results_and_writes_the_new_fields(tmp_path, capsys):
    """A device-check result of the report's own chip is the calibration it prints (the toy's update on a v5e-8)."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "device_check_v5e.json").write_text(json.dumps({
        "chip": "TPU v5e", "jax_version": "0.10.2", "date": "2026-12-03",
        "update": {"packing_on": {"seconds": 2.0, "estimate_seconds": 1.0, "estimate_with_memory_seconds": 1.6}}}))
    out = tmp_path / "report.json"
    assert cli.compile_main([TOY, "--topology", "v5e:2x4", "--programs", "update", "--calibration", str(results),
                             "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("measured 2.0x this on a v5e, jax 0.10.2)") == 1
    assert printed.count("measured 1.2x this on a v5e, jax 0.10.2)") == 1
    assert _unqualified_mfu(printed) == []
    (update,) = json.loads(out.read_text())["programs"]
    assert update["estimated_seconds_with_memory"] == pytest.approx(update["estimated_seconds"]
                                                                    + update["memory_bound_seconds"])
    assert update["memory_bound_bytes"] >= 0 and 0 < update["mfu_with_memory"] <= update["mfu"]
    assert update["calibration"]["chip"] == "TPU v5e" and update["calibration"]["factor"] == 2.0


# -- a program that does not fit -----------------------------------------------------------------------------

# XLA's messages as it writes them. The GPU's two were seen on an H100 (jax 0.11.2): a run-time allocation, and
# GEMM autotuning while compiling; the CPU's from jax 0.10.2 here; the TPU compiler's from docs/tpu/*.json.
MESSAGES = {
    "gpu run": ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 512.00GiB with allocator GPU_0_bfc on "
                "device 0. [executable_name='jit__lambda'] [tf-allocator-allocation-error='']", 512 * GiB),
    "gpu autotuning": ("RESOURCE_EXHAUSTED: Failed to get configs for: 2 out of 2 instructions. See logs for all "
                       "failures. Example failure: \nOut of memory while trying to allocate 59.57GiB with allocator "
                       "GPU_0_bfc on device 0. [tf-allocator-allocation-error='']", int(59.57 * GiB)),
    "gpu bytes": ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 63963136000 bytes.", 63963136000),
    "cpu": ("RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes.", 4398046511104),
    "tpu": ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used "
            "33.05G of 15.75G hbm. Exceeded hbm capacity by 17.30G.", int(33.05 * GiB)),
    "none": ("RESOURCE_EXHAUSTED: in 3 steps", None),
}


@pytest.mark.parametrize("name", list(MESSAGES))
def test_the_bytes_an_out_of_memory_message_asks_for(name):
    message, expected = MESSAGES[name]
    assert requested_bytes(message) == expected


class XlaRuntimeError(RuntimeError):
    """What jaxlib raises (jax.errors.JaxRuntimeError, formerly jaxlib...XlaRuntimeError): a RuntimeError."""


class Device:
    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return {"bytes_limit": self.limit}


def _config(*overrides):
    cfg = load_experiment(os.path.join(ROOT, "experiments", "qwen3_0_6b_grpo.py"))
    apply_overrides(cfg, list(overrides))
    return cfg


def test_the_out_of_memory_line_names_the_program_what_it_needs_and_what_to_change():
    error = XlaRuntimeError(MESSAGES["gpu autotuning"][0])
    h200 = Device(int(139.81 * GiB))
    assert device_memory.message(_config(), "update", error, h200, 1) == (
        "the update does not fit in device memory: XLA could not allocate 59.57 GiB on a device of 139.81 GiB "
        "(RESOURCE_EXHAUSTED); try micro_batch_size=8 (now 16), packing=false, optimizer.state_dtype=bfloat16, or "
        "fewer tokens per row (sampling.max_new_tokens, now 512)")
    # Only what changes something: remat and bfloat16 are suggested where they are off.
    line = device_memory.message(_config("remat=false", "dtype=float32", "packing=false", "micro_batch_size=1"),
                                 "update", XlaRuntimeError("RESOURCE_EXHAUSTED: no size"), None, 1)
    assert line == ("the update does not fit in device memory: XLA ran out of memory (RESOURCE_EXHAUSTED); try "
                    "remat=true, dtype=bfloat16, optimizer.state_dtype=bfloat16, or fewer tokens per row "
                    "(sampling.max_new_tokens, now 512)")
    # A remat policy that keeps activations: recomputing the whole layer shrinks the update.
    assert "micro_batch_size=8 (now 16), remat_policy=full (now save_projections), packing=false" in \
        device_memory.message(_config("remat_policy=save_projections"), "update", error, h200, 1)
    assert device_memory.message(_config(), "sampler", error, Device(None), 1) == (
        "the sampler does not fit in device memory: XLA could not allocate 59.57 GiB (RESOURCE_EXHAUSTED); try "
        "fewer rows (prompts_per_step, now 16, or group_size, now 8; task.num_eval_examples, now 64, in "
        "evaluation), or fewer tokens (sampling.max_new_tokens, now 512; sampling.max_prompt_len, now 512)")
    assert device_memory.message(_config(), "scoring forward", error, None, 1).endswith(
        "try fewer rows (prompts_per_step x group_size, now 128), or fewer tokens per row "
        "(sampling.max_new_tokens, now 512)")
    # Micro-batches a mesh of 8 devices cannot split are not suggested.
    assert "micro_batch_size=8 (now 16)" in device_memory.message(_config(), "update", error, None, 8)
    assert device_memory.smaller_micro_batch(_config("micro_batch_size=8"), 8) is None
    # Packing holds whole groups of 8 a micro-batch: a smaller one needs packing off, which one device allows.
    assert "micro_batch_size=4 (now 8) with packing=false" in device_memory.message(
        _config("micro_batch_size=8"), "update", error, None, 1)
    assert "micro_batch_size" not in device_memory.message(_config("micro_batch_size=8"), "update", error, None, 8)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from jaxgrpo.train.loop import Trainer

    cfg = load_experiment(TOY)
    apply_overrides(cfg, [*SMALL, f"run_dir={tmp_path_factory.mktemp('oom') / 'run'}"])
    return Trainer(cfg)


def _raising(message):
    def program(*args, **kwargs):
        raise XlaRuntimeError(message)

    return program


def test_the_update_sampler_and_scoring_forward_say_they_do_not_fit_with_xla_chained(trainer, monkeypatch):
    from jaxgrpo import engine
    from jaxgrpo.train import step as step_lib

    message = MESSAGES["gpu autotuning"][0]
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(0))
    batch = trainer.advantages(trainer.loop_state, rollout)
    monkeypatch.setattr(step_lib, "make_update_fn", lambda *args, **kwargs: _raising(message))
    monkeypatch.setattr(trainer, "_updates", {})
    with pytest.raises(OutOfDeviceMemory) as raised:
        trainer.update(trainer.state, batch)
    assert str(raised.value).startswith("the update does not fit in device memory: XLA could not allocate 59.57 GiB")
    # 8 rows a micro-batch over the 8 devices: no smaller micro-batch splits over them, so none is suggested.
    assert "\n" not in str(raised.value) and "micro_batch_size" not in str(raised.value)
    assert "optimizer.state_dtype=bfloat16" in str(raised.value)
    assert isinstance(raised.value.__cause__, XlaRuntimeError) and str(raised.value.__cause__) == message
    with monkeypatch.context() as patch:
        patch.setattr(engine, "generate_groups", _raising(message))  # the rollout engine, the trainer's sampler
        with pytest.raises(OutOfDeviceMemory, match="^the sampler does not fit in device memory"):
            trainer.rollout(trainer.loop_state, jax.random.key(0))
    monkeypatch.setattr(trainer, "_forward", _raising(message))
    with pytest.raises(OutOfDeviceMemory, match="^the scoring forward does not fit in device memory"):
        trainer.logprobs(trainer.state.params, batch.tokens, batch.attention_mask, batch.positions, batch.completion_mask.shape[-1])
    # Any other error is not one of these.
    monkeypatch.setattr(trainer, "_forward", _raising("INTERNAL: something else"))
    with pytest.raises(XlaRuntimeError):
        trainer.logprobs(trainer.state.params, batch.tokens, batch.attention_mask, batch.positions, batch.completion_mask.shape[-1])


def test_jaxgrpo_train_prints_the_one_line_and_exits_1(tmp_path, capsys, monkeypatch):
    """The update's first call raises what XLA raises on a GPU that cannot hold it: stderr is that one line."""
    from jaxgrpo.train import step as step_lib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(step_lib, "make_update_fn", lambda *args, **kwargs: _raising(MESSAGES["gpu run"][0]))
    status = cli.train_main([TOY, "--run-dir", str(tmp_path / "run"), "--set", *SMALL])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    # Besides the progress bar (which stops where the step failed), stderr holds the one line.
    lines = [line for line in re.split(r"[\r\n]+", err.strip()) if not re.match(r"train: +\d+%", line)]
    assert lines == [
        "jaxgrpo-train: error: the update does not fit in device memory: XLA could not allocate 512.00 GiB "
        "(RESOURCE_EXHAUSTED); try dtype=bfloat16, packing=false, "
        "optimizer.state_dtype=bfloat16, or fewer tokens per row (sampling.max_new_tokens, now 2)"], err
    with open(tmp_path / "run" / "run.lock") as lock:  # the run directory is free for the next try
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
