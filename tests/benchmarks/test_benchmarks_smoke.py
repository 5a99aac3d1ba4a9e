"""Fast checks of the benchmark scripts' pure helpers: FLOP count, memory scaling, report parsing."""

import importlib.util
import os
import types

import jax
import pytest

from jaxgrpo.models import DecoderConfig
from tests.support.paths import REPO_ROOT

BENCHMARKS = os.path.join(REPO_ROOT, "benchmarks")
TINY = DecoderConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, tie_word_embeddings=True)


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_flops_by_hand():
    throughput = load_script("train_throughput")
    # 6 N tokens + 12 L H Q T tokens with N=1000, 2 x 16 tokens, L=2, H=4, Q=8, T=16.
    expected = 6 * 1000 * 32 + 12 * 2 * 4 * 8 * 16 * 32
    assert throughput.model_flops(TINY, 1000, batch=2, length=16) == expected


def test_decode_weight_products_cover_every_parameter_once():
    sampler_bench = load_script("sampler")
    products = sampler_bench.weight_products(TINY, rows=4, repeats=1)
    # Every weight matrix of the layers and the (tied) unembedding is multiplied once per decode step.
    weights = sum(count * fan_in * fan_out for _, (fan_in, fan_out), count, _ in products)
    c = TINY
    layer = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * c.hidden_size * c.intermediate_size
    assert weights == c.num_layers * layer + c.hidden_size * c.vocab_size
    assert all(seconds > 0 for *_, seconds in products)


@pytest.mark.parametrize("scheme", ["fsdp", "fsdp_tp"])
def test_parameter_and_optimizer_bytes_halve_on_two_devices(scheme):
    scaling = load_script("scaling_memory")
    configs = {"tiny": TINY}
    one = scaling.measure("tiny", scheme, 1, batch=4, prompt=8, completion=8, configs=configs)
    two = scaling.measure("tiny", scheme, 2, batch=4, prompt=8, completion=8, configs=configs)
    assert one["param_bytes"] == one["param_bytes_global"]
    # Every tiny dimension divides by 2, so the shards are exact halves; except that on the (1, 1, 2) mesh of
    # FSDP x TP the RMSNorm weights (sharded over data/fsdp only) stay whole on both devices.
    norms = 0 if scheme == "fsdp" else (2 * TINY.num_layers + 1) * TINY.hidden_size * 4
    assert two["param_bytes"] * 2 == one["param_bytes"] + norms
    # AdamW holds two moments per parameter (so the whole norms count twice), plus step counters.
    assert two["optimizer_bytes"] * 2 == pytest.approx(one["optimizer_bytes"] + 2 * norms, abs=16)
    assert two["activation_bytes"] < one["activation_bytes"]


def test_mesh_shapes():
    scaling = load_script("scaling_memory")
    assert scaling.mesh_shape("fsdp", 8) == (1, 8, 1)
    assert scaling.mesh_shape("fsdp_tp", 8) == (1, 4, 2)
    assert scaling.mesh_shape("fsdp_tp", 1) == (1, 1, 1)
    with pytest.raises(ValueError, match="unknown scheme"):
        scaling.mesh_shape("pipeline", 2)
    # The decoder shards its own activations now: no pinned what-if scheme is left.
    assert scaling.SCHEMES == ("fsdp", "fsdp_tp")


def test_markdown_tables_are_parsed_with_their_title():
    report = load_script("report")
    text = "### Throughput\n\n| sampler | tok/s |\n|---|---|\n| ours | 1,200 |\n| **ratio** | **3.10x** |\n\nafter\n"
    (table,) = report.parse_markdown_tables(text)
    assert table["title"] == "Throughput"
    assert table["header"] == ["sampler", "tok/s"]
    assert table["rows"] == [["ours", "1,200"], ["**ratio**", "**3.10x**"]]
    assert report.number(report.table_value({"tables": [table]}, "ratio", 1)) == pytest.approx(3.10)
    assert report.number(table["rows"][0][1]) == 1200


def test_the_sampler_floor_table_feeds_the_reports_note(capsys):
    sampler_bench, report = load_script("sampler"), load_script("report")
    sampler_bench.floor(types.SimpleNamespace(config=TINY), repeats=1, decode_step=0.002, theirs_per_token=0.5)
    throughput = "| sampler | tokens/s |\n|---|---|\n| **ratio jaxgrpo / transformers (median of 3 pairs)** | **1.50x** |\n"
    data = {"tables": report.parse_markdown_tables(throughput + capsys.readouterr().out)}
    floor_ms = report.number(report.table_value(data, "all weight products of a decode step", 5))
    (note,) = report.sampler_notes(data)
    assert f"take {floor_ms:.1f} ms per step" in note and "allows 166.7 ms per generated token" in note
    best = report.number(report.table_value(data, "best ratio with these weight products alone", 5))
    assert f"could not exceed {best:.2f}x" in note and "decode step is 2.0 ms" in note
    assert note.startswith("**Sampler vs transformers generate, float32 (1.50x, goal 3x).**")
    (bfloat16_note,) = report.sampler_notes(data, dtype="bfloat16")
    assert bfloat16_note.startswith("**Sampler vs transformers generate, bfloat16 (1.50x") and "cheaper attention reads" in bfloat16_note
    # A decode step within the budget: the note says what else the throughput run's time per token counts.
    rates = "| sampler | tokens/s |\n|---|---|\n| jaxgrpo.engine, 32 slots (jax 0.10.2) | 300 |\n| transformers 5.23.0 generate | 200 |\n"
    sampler_bench.floor(types.SimpleNamespace(config=TINY), repeats=1, decode_step=0.1, theirs_per_token=0.5)
    fits = {"tables": report.parse_markdown_tables(rates + "\n" + throughput + "\n" + capsys.readouterr().out)}
    (fits_note,) = report.sampler_notes(fits, dtype="bfloat16")
    assert "fits the 166.7 ms budget" in fits_note and "took 333.3 ms per generated token of a row" in fits_note
    met = throughput.replace("1.50x", "3.20x")
    assert report.sampler_notes({"tables": report.parse_markdown_tables(met)}) == []


def test_report_renders_without_results(tmp_path):
    report = load_script("report")
    text = report.render({}, "", str(tmp_path))
    assert "# Benchmarks" in text and "Not run in this session" in text and "sampler" in text


def test_fake_devices_present():
    assert jax.device_count() >= 2, "conftest provides 8 fake CPU devices"


def test_profile_step_attributes_a_tiny_training_step():
    from flax import nnx

    from jaxgrpo.models import Decoder

    profile = load_script("profile_step")
    title, breakdown, settings = profile.train_breakdown(Decoder(TINY, rngs=nnx.Rngs(0)), 2, 8, 8, calls=1)
    assert settings == {"batch": 2, "prompt": 8, "completion": 8} and "2 rows x (8 prompt + 8 completion)" in title
    assert "MLP (gate, up, down) (backward)" in breakdown.seconds
    assert breakdown.attributed_seconds > 0


def test_profile_step_attributes_a_tiny_engine_decode_chunk():
    """The decode breakdown traces the rollout engine's decode chunk: its program's instructions, under the model's
    parts (attention reads and sampling among them)."""
    from flax import nnx

    from jaxgrpo.models import Decoder

    profile = load_script("profile_step")
    prompts = [list(range(1, 21)), list(range(21, 41))]
    title, breakdown, settings = profile.decode_breakdown(Decoder(TINY, rngs=nnx.Rngs(0)), prompts, 2, 4, 1, 32)
    assert settings == {"steps": 4, "rows": 4} and title.startswith("Decode: 4 rows (2 prompts x G=2), prompt 20")
    assert {"attention scores, softmax and values (cache reads)", "sampling (temperature, truncation, draw)"} <= set(
        breakdown.seconds)
    assert all(name.startswith("jit_engine_decode/") for name in breakdown.instructions)
    assert breakdown.attributed_seconds > 0 and breakdown.wall_seconds > 0


def test_engine_batching_runs_on_the_toy():
    """benchmarks/engine_batching.py end to end on the toy, tiny shapes: both ways through the engine timed, their
    ratio printed."""
    import re
    import subprocess
    import sys

    script = os.path.join(BENCHMARKS, "engine_batching.py")
    out = subprocess.run([sys.executable, script, "--model", "toy", "--requests", "8", "--slots", "4", "--budget", "8",
                          "--repeats", "1"], capture_output=True, text=True, timeout=600, check=True).stdout
    rows = dict(re.findall(r"^\| (continuous|fixed \(engine\)) \| ([0-9.]+) \|", out, re.M))
    assert set(rows) == {"continuous", "fixed (engine)"}
    assert re.search(r"^continuous / fixed \(engine\): median [0-9.]+ \(pairs: [0-9.]+\)$", out, re.M)
