"""The TPU recipes in experiments/tpu/ are valid configs for the slices they name, their state fits a chip,
and docs/tpu.md is rendered from the committed compile reports (docs/tpu/*.json) and up to date."""

import glob
import importlib.util
import os

import pytest

from jaxgrpo import train
from jaxgrpo.config import load_experiment, validate
from jaxgrpo.distributed import batch_shards
from jaxgrpo.tools import compile as aot
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
RECIPES = sorted(glob.glob(os.path.join(ROOT, "experiments", "tpu", "*.py")))


def _tpu_docs():
    spec = importlib.util.spec_from_file_location("tpu_docs", os.path.join(ROOT, "benchmarks", "tpu_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", RECIPES, ids=[os.path.basename(p)[:-3] for p in RECIPES])
def test_recipe_is_valid_for_its_slice_and_its_state_fits_a_chip(path):
    spec = importlib.util.spec_from_file_location("recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = load_experiment(path)
    chip, devices = aot.topology_devices(module.TOPOLOGY)
    mesh = train.make_mesh(cfg, devices)
    validate(cfg, row_shards=batch_shards(mesh))
    assert (cfg.prompts_per_step, cfg.group_size, cfg.sampling.max_prompt_len, cfg.sampling.max_new_tokens) == (
        16, 8, 512, 1024)
    assert cfg.dtype == "bfloat16" and cfg.remat and not cfg.packing and cfg.mesh.fsdp == -1
    # Parameters and both Adam moments, split over the chips, leave most of a chip's HBM to activations.
    state = aot.abstract_train_state(cfg, mesh).state
    assert aot.per_chip_bytes(state) < chip.hbm_bytes / 2
    # Each micro-batch's rows divide over the chips (no chip idles in the update).
    assert cfg.micro_batch_size % len(devices) == 0


def test_tpu_docs_are_rendered_from_the_committed_reports():
    docs = _tpu_docs()
    with open(docs.DOC_PATH) as f:
        committed = f.read()
    assert committed == docs.render(), f"docs/tpu.md is stale: run `{docs.COMMAND}` and commit the result"
    reports = docs.load_reports()
    assert reports, "no compile reports in docs/tpu/"
    for report in reports:
        assert report["experiment"] and os.path.exists(os.path.join(ROOT, report["experiment"]))
        assert f"| {report['model']} | {report['topology']}" in committed
        # Every report says which attention its programs were traced with (the recipes compiled before
        # pallas_tpu became the TPU default say xla), so no row is read as another implementation's.
        assert report.get("attention") in ("xla", "pallas_tpu"), report["name"]


def test_long_sequence_goals_read_linear_growth_and_fits():
    """The goals' long-sequence rows: temporaries growing by the same bytes per token are linear, a
    quadratic growth is not; a report that does not fit says no."""
    docs = _tpu_docs()
    GiB = docs.GiB

    def report(name, t, temp_gib, fits=True):
        program = {"program": "update", "temp_bytes": temp_gib * GiB, "hbm_bytes": (temp_gib + 1) * GiB,
                   "hbm_capacity": 16 * GiB, "fits": fits}
        return name, {"name": name, "experiment": "experiments/tpu/qwen3_1_7b_gsm8k_v5e_8.py", "attention": "pallas_tpu",
                      "overrides": ["sampling.max_prompt_len=0", f"sampling.max_new_tokens={t}"], "programs": [program]}

    sizes = (2048, 8192, 16384, 32768)
    linear = dict(report(name, t, 1 + t / 4096) for name, t in zip(docs.LINEAR_SWEEP, sizes))
    quadratic = dict(report(name, t, 1 + (t / 4096) ** 2) for name, t in zip(docs.LINEAR_SWEEP, sizes))
    rows = docs._long_sequence_goals(linear)
    assert rows[0].startswith("| Qwen3-1.7B update temporaries linear in T") and rows[0].endswith("| yes |")
    assert "0.25-0.25 GiB per 1k tokens" in rows[0]
    assert docs._long_sequence_goals(quadratic)[0].endswith("| no |")
    name = docs.LONG_FIT_GOALS[0][1]
    too_big = {**linear, name: report(name, 32768, 20, fits=False)[1]}
    assert docs._long_sequence_goals(too_big)[1].endswith("| no |")
    assert docs._long_sequence_goals({})[0].endswith("| not compiled | no |")


def test_engine_reports_are_goals_of_their_own_and_name_one_hosts_engine():
    """A report of the engine's programs alone is not the recipe's (its fit, MFU and decode goals stay the recipe
    report's): its full pool's decode step is a goal against the floor, and on several hosts its rows name one host's
    engine."""
    docs = _tpu_docs()

    def program(name, seconds=None, floor=None):
        return {"program": name, "estimated_seconds": seconds, "step_floor_seconds": floor}

    engine = {"name": "x_engine", "model": "qwen3-1.7b", "topology": "v5e:2x4", "hosts": 2, "chips": 8,
              "attention": "pallas_tpu", "programs": [program("engine prefill"),
                                                      program("engine decode 100% full", 5e-3, 4e-3)]}
    assert docs.engine_report(engine) and not docs.engine_report({**engine, "programs": [program("decode")]})
    (row,) = docs._engine_goals([engine])
    assert "(one host's engine, 64 slots, pool full)" in row and row.endswith("| 5.00 / 4.00 ms = 1.25x | yes |")
    slow = {**engine, "programs": [program("engine decode 100% full", 6e-3, 4e-3)]}
    assert docs._engine_goals([slow])[0].endswith("= 1.50x | no |")
    assert docs.program_label(engine, engine["programs"][1]) == "engine decode 100% full (a host's: 4 chips)"
