"""benchmarks/device_goals.py reads device_check JSONs against the GPU goals: checked on figures written here."""

import json
import os
import sys

import pytest

from tests.support.paths import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import device_goals  # noqa: E402

ENV = {"chip": "NVIDIA H200", "jax": "0.11.2"}
DECODE = {"env": ENV, "shapes": {"prompts": 16}, "model": "random-qwen3-0.6b", "small": False,
          "sampler": {"tokens_per_second": 40_000.0, "ms_per_decode_step": 3.1, "floor_ratio": 1.9},
          "decode_loop": {"engine": {"tokens_per_second": 40_000.0, "ms_per_decode_step": 3.2, "floor_ratio": 1.9},
                          "engine-graphs": {"tokens_per_second": 55_000.0, "ms_per_decode_step": 2.3},
                          "engine-unshared": {"error": "RuntimeError: ..."},
                          "profile": {"device_busy_share": 0.9}},
          "torch": {"generate": {"tokens_per_second": 8_000.0}}}
TRAIN = {"env": ENV, "train": {"packing_off": {"mfu": 0.42, "update_seconds": 1.2, "step_seconds": 4.0,
                                               "measured_over_estimate_with_memory": 1.3, "logp_gap_max": 0.4},
                               "packing_off_save_projections_unrolled": {"mfu": 0.5, "update_seconds": 1.0}},
         "torch": {"update": {"seconds": 1.5}}}


def test_each_goal_is_read_from_the_halves_merged_with_the_anchors_of_either():
    rows = {row["goal"].split(" (")[0]: row for row in device_goals.assess(
        device_goals.with_ratios(device_goals.merge([DECODE, TRAIN])))}
    assert rows["update MFU"]["met"] is True and rows["update MFU"]["shown"] == "42.0%"
    speedup = rows["update speed over transformers + torch"]
    assert speedup["value"] == pytest.approx(1.25) and speedup["met"] is False  # the anchor from the train half
    assert rows["whole GRPO step"]["met"] is True
    decode = rows["decode step at batch 128, 512 new tokens"]
    assert decode["value"] == 3.2 and decode["met"] is False
    assert decode["source"] == "decode_loop.engine.ms_per_decode_step"
    assert rows["decode step over its HBM floor"]["met"] is True
    generate = rows["decode speed over transformers' generate"]
    assert generate["value"] == pytest.approx(5.0) and generate["met"] is True
    assert rows["device busy during the decode"]["met"] is True
    assert rows["the sampler's log-probs against the trainer's"]["met"] is False  # 0.4: a kernel to look at


def test_what_was_not_measured_is_said_so_and_the_sampler_stands_in_for_the_decode_loop():
    rows = {row["goal"]: row for row in device_goals.assess({"sampler": DECODE["sampler"]})}
    decode = rows["decode step at batch 128, 512 new tokens"]
    assert decode["value"] == 3.1 and decode["source"] == "sampler.ms_per_decode_step"
    mfu = next(row for name, row in rows.items() if name.startswith("update MFU"))
    assert mfu["met"] is None and mfu["shown"] == "not measured"


def test_the_table_names_the_fastest_variant_and_run(tmp_path, capsys):
    paths = []
    for name, result in (("decode", DECODE), ("train", TRAIN)):
        paths.append(str(tmp_path / f"{name}.json"))
        with open(paths[-1], "w") as f:
            json.dump(result, f)
    assert device_goals.main(paths) == 0
    table = capsys.readouterr().out
    assert table.startswith("Device check on NVIDIA H200 (jax 0.11.2), random-qwen3-0.6b")
    assert "| decode step at batch 128, 512 new tokens | <= 2.50 ms | 3.20 ms | **no** |" in table
    assert "Fastest decode variant: `engine-graphs`, 2.30 ms a step (the default `engine`: 3.20 ms)." in table
    assert ("Fastest update: `packing_off_save_projections_unrolled`, 1.000 s, 50.0% measured MFU (the default "
            "`packing_off`: 1.200 s).") in table
    assert "measured / estimate = 1.30" in table


def test_files_of_different_chips_or_not_json_are_refused_in_one_line(tmp_path, capsys):
    other = tmp_path / "h100.json"
    other.write_text(json.dumps({"env": {"chip": "NVIDIA H100 80GB HBM3"}}))
    ours = tmp_path / "h200.json"
    ours.write_text(json.dumps(DECODE))
    with pytest.raises(SystemExit):
        device_goals.main([str(ours), str(other)])
    assert "the files are of different chips (NVIDIA H100 80GB HBM3, NVIDIA H200)" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SystemExit):
        device_goals.main([str(broken)])
    assert f"cannot read {broken} as a device_check JSON" in capsys.readouterr().err
