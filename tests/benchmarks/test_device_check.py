"""benchmarks/device_check.py runs end to end (`--small`, on this CPU) and writes every section it measures."""

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.support import processes
from tests.support.paths import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "device_check.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check") / "device_check.json"
    # One device, as on one accelerator (the suite's conftest gives the process eight CPU devices).
    command = [sys.executable, SCRIPT, "--small", "--out", str(out), "--trace-dir", str(out.parent / "trace"),
               "--train-runs", "packing_on,packing_off,packing_off_remat_off,packing_off_save_projections_unrolled,"
               "packing_off_float32_products,packing_on_one_step_off",
               "--decode-variants",
               "engine,engine-views,engine-graphs,engine-no-split-k,engine-stacked-writes-each,engine-unshared"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=processes.child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_section_is_measured(result):
    assert result["small"] and result["env"]["platform"] == "cpu" and result["env"]["jax"]
    assert result["env"]["device_count"] == 1
    for section in ("matmul", "attention", "sampler", "decode_loop", "train", "torch"):
        assert section in result and "error" not in result[section], (section, result.get(section))
    assert result["matmul"]["peak_flops"] > 0 and result["matmul"]["bandwidth"] > 0


def test_attention_forms_agree_with_the_reference(result):
    attention = result["attention"]
    assert {"xla/packed", "xla/unpacked", "cpu/packed", "cpu/unpacked"} <= set(attention)
    for name, entry in attention.items():
        assert entry["seconds"] > 0, name
        for part, difference in entry.get("relative_difference_from_xla", {}).items():
            assert difference < 1e-2, (name, part, difference)  # bfloat16 outputs and gradients


def test_sampler_and_train_figures_are_consistent(result):
    sampler = result["sampler"]
    assert sampler["tokens_per_second"] > 0 and sampler["hbm_floor_ms_per_step"] > 0
    shapes = result["shapes"]
    for key in ("packing_on", "packing_off"):
        run = result["train"][key]
        assert "error" not in run, run
        assert run["packing"] == (key == "packing_on")
        assert run["update_seconds"] > 0 and run["step_seconds"] > 0  # timed apart: no order between them
        assert 0 < run["mfu"] < 1 and run["estimate_seconds"] > 0
        assert run["measured_over_estimate"] == pytest.approx(run["update_seconds"] / run["estimate_seconds"])
        assert run["update_tokens"] == shapes["prompts"] * shapes["samples"] * (shapes["prompt_len"] + shapes["new_tokens"])
        assert len(run["steps"]) == shapes["steps"]
        assert all(step["frac_signal_rows"] > 0 for step in run["steps"])  # the parity reward varies in a group


def test_one_step_off_is_timed_beside_the_synchronous_step(result):
    run, sync = result["train"]["packing_on_one_step_off"], result["train"]["packing_on"]
    assert "error" not in run, run
    assert run["max_staleness"] == 1 and sync["max_staleness"] == 0
    assert run["step_speedup_over_sync"] == pytest.approx(sync["step_seconds"] / run["step_seconds"])
    assert len(run["steps"]) == result["shapes"]["steps"] and run["update_seconds"] > 0


def test_the_engines_decode_is_timed_in_each_variant(result):
    decode = result["decode_loop"]
    # A CPU accepts the GPU's compiler options and ignores them; "engine" (the backend's choice: dense views on a CPU)
    # and "engine-views" (dense views asked for) are the same program here.
    variants = ("engine", "engine-views", "engine-graphs", "engine-no-split-k", "engine-stacked-writes-each",
                "engine-unshared")
    assert set(decode) == {*variants, "profile"}
    for name in variants:
        assert "error" not in decode[name], (name, decode[name])
        assert decode[name]["tokens_per_second"] > 0 and decode[name]["floor_ratio"] > 0, (name, decode[name])
    profile = decode["profile"]
    assert profile["wall_seconds"] > 0 and profile["device_busy_seconds"] is None  # no accelerator in the trace
    assert profile["per_new_token"] is None
    # the trace's files copied up beside their folder, where a tool returning shallow files finds them
    assert glob.glob(os.path.join(profile["trace_dir"], "*.xplane.pb"))
    assert glob.glob(os.path.join(profile["trace_dir"], "*.trace.json.gz"))


def test_the_layers_are_timed_unrematerialized_and_under_a_remat_policy_unscanned(result):
    for key, remat, scanned, float32 in (("packing_off", True, True, False),
                                         ("packing_off_remat_off", False, True, False),
                                         ("packing_off_save_projections_unrolled", "save_projections", False, False),
                                         ("packing_off_float32_products", True, True, True)):
        run = result["train"][key]
        assert "error" not in run, (key, run)
        assert run["remat"] == remat and run["scan_layers"] is scanned, (key, run)
        assert run["float32_products"] is float32, (key, run)
        assert run["update_seconds"] > 0 and 0 < run["mfu"] < 1, (key, run)
        # the sampler's log-probs against the trainer's before each update: the same model, bfloat16 rounding apart
        assert 0 <= run["logp_gap_max"] < 0.05 and len([s["logp_gap"] for s in run["steps"]]) == len(run["steps"])


def test_float32_products_swaps_the_accelerators_products_and_restores_them():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import device_check

    from jaxgrpo.models import memory_forms

    before = memory_forms.PLAIN, memory_forms.GPU
    with device_check.float32_products():
        assert memory_forms.PLAIN.product is memory_forms.GPU.product is memory_forms.float32_product
        assert memory_forms.GPU.pack_weights is before[1].pack_weights  # the rest of the forms as they were
    with device_check.float32_products(False):
        assert (memory_forms.PLAIN, memory_forms.GPU) == before
    assert (memory_forms.PLAIN, memory_forms.GPU) == before
    assert before[0].product is before[1].product is memory_forms.product_in_dtype


def test_the_torch_anchor_ran_in_its_own_processes(result):
    torch_section = result["torch"]
    if "skipped" in torch_section:
        pytest.importorskip("torch")  # only a machine without torch may skip the anchor
    assert torch_section["generate"]["tokens_per_second"] > 0
    assert torch_section["update"]["seconds"] > 0
    assert all(run["speedup_over_torch"] > 0 for run in result["train"].values())
    generate = torch_section["generate"]["tokens_per_second"]
    assert result["sampler"]["speedup_over_torch_generate"] == result["sampler"]["tokens_per_second"] / generate
    assert all(entry["speedup_over_torch_generate"] > 0 for name, entry in result["decode_loop"].items()
               if name != "profile")


def test_the_anchors_are_those_of_the_sections_run():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import device_check

    assert device_check.anchor_kinds(["env", "sampler", "decode_loop", "torch"]) == ("generate",)
    assert device_check.anchor_kinds(["env", "attention", "train", "torch"]) == ("update",)
    assert device_check.anchor_kinds(device_check.SECTIONS) == ("generate", "update")
    assert device_check.anchor_kinds(["env", "torch"]) == ("generate", "update")


def test_the_unshared_variant_plans_no_shared_prefixes_and_restores_the_engine():
    """Within "engine-unshared" a chunk's rows stay in slot order with no `SharedPrefixes` (each reads its whole
    context), and the engine plans as before afterwards (the --small run above times the variant end to end)."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import device_check

    from jaxgrpo.engine import engine as engine_module

    planned = engine_module.Engine._chunk_rows
    with device_check.decode_variant(device_check.DECODE_VARIANTS["engine-unshared"]):
        running = [object(), object()]  # two rows, in slot order
        assert engine_module.Engine._chunk_rows(None, running) == (running, None, 0)
    assert engine_module.Engine._chunk_rows is planned


@pytest.mark.parametrize("fails, ran", [
    ("the kernel's merges", ("engine", "engine-merged-outside")),
    ("the paged kernel", ("engine", "engine-merged-outside", "engine-views")),
    ("nothing", ("engine",)),
])
def test_a_failing_engine_decode_falls_back_to_the_merges_outside_then_to_the_views(monkeypatch, capsys, fails, ran):
    """Where "engine" fails (a Triton kernel that does not compile on the GPU at hand), the decode section runs
    "engine-merged-outside" (the paged kernel, its states merged by XLA) and, if that fails too, "engine-views" (no
    paged kernel), so a GPU run keeps a figure; each failure is recorded in one line and the implementation is
    restored after each variant."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import device_check

    from jaxgrpo.models.attention import pallas_gpu

    implementation = pallas_gpu.IMPLEMENTATION
    monkeypatch.setattr(device_check, "through_engine", lambda model, shapes, in_place=None: (
        in_place is not False, pallas_gpu.IMPLEMENTATION.paged_attention is not None))

    def sampler_section(model, shapes, bandwidth, generate):
        in_place, merges_in_kernel = generate
        if (fails == "the paged kernel" and in_place) or (fails == "the kernel's merges" and merges_in_kernel):
            raise RuntimeError(f"{fails} failed to compile\nTriton's long report")
        return {"tokens_per_second": 1.0}

    monkeypatch.setattr(device_check, "sampler_section", sampler_section)
    shapes = device_check.Shapes(**device_check.SMALL_SHAPES)
    result = device_check.decode_section(None, shapes, 1.0, None, variants=("engine",))
    assert tuple(result) == ran
    succeeded = [name for name, entry in result.items() if "error" not in entry]
    assert succeeded == [ran[-1]]  # the failures before it recorded, nothing after it run
    if fails != "nothing":
        assert result["engine"] == {"error": f"RuntimeError: {fails} failed to compile"}
    assert pallas_gpu.IMPLEMENTATION is implementation


def test_a_train_run_whose_engine_fails_is_retried_with_the_engine_fallbacks_and_keeps_the_one_that_ran():
    """The GRPO step samples through the rollout engine: where a train run fails inside the engine (here its
    allocator refuses while the paged kernel merges the states, as a Triton kernel that does not compile would), it
    is run again as "engine-merged-outside", whose figures carry `engine_fallback`, and the runs after it start
    there. A failure outside the engine is recorded as it is, not retried; inside every form of it, recorded
    too. The engine's reader and the GPU implementation are restored after each try."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import device_check

    from jaxgrpo.engine import blocks
    from jaxgrpo.engine import engine as engine_module
    from jaxgrpo.models.attention import pallas_gpu

    implementation, reader = pallas_gpu.IMPLEMENTATION, engine_module.reads_pages_in_place
    tries = []

    def run(fails_in_engine_while=lambda: pallas_gpu.IMPLEMENTATION.paged_attention is not None):
        tries.append((pallas_gpu.IMPLEMENTATION.paged_attention is not None,
                      engine_module.reads_pages_in_place is reader))
        if fails_in_engine_while():
            blocks.BlockAllocator(num_blocks=1, block_size=16)  # raises, inside jaxgrpo/engine/
        return {"update_seconds": 1.0}

    fallbacks = [None, *device_check.FALLBACK_DECODE_VARIANTS]
    entry = device_check.train_with_engine_fallbacks(run, fallbacks)
    assert entry == {"update_seconds": 1.0, "engine_fallback": "engine-merged-outside"}
    assert tries == [(True, True), (False, True)] and fallbacks[0] == "engine-merged-outside"
    assert device_check.train_with_engine_fallbacks(run, fallbacks)["engine_fallback"] == "engine-merged-outside"
    assert (pallas_gpu.IMPLEMENTATION, engine_module.reads_pages_in_place) == (implementation, reader)

    tries.clear()  # failing in every form: recorded in one line after trying each
    entry = device_check.train_with_engine_fallbacks(lambda: run(lambda: True), [None, "engine-views"])
    assert entry == {"error": "ValueError: num_blocks must be >= 2 (block 0 is the null block), got 1"}
    assert tries == [(True, True), (True, False)]  # dense views: the engine's reader says no pages in place

    def out_of_memory():
        tries.append("update")
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

    tries.clear()
    assert device_check.train_with_engine_fallbacks(out_of_memory, [None, "engine-views"]) == {
        "error": "RuntimeError: RESOURCE_EXHAUSTED: out of memory"}
    assert tries == ["update"]
    assert (pallas_gpu.IMPLEMENTATION, engine_module.reads_pages_in_place) == (implementation, reader)
