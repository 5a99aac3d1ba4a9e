"""Ahead-of-time compilation for TPU topologies (libtpu, no TPU): the toy experiment's sampling and training
programs fit, shard as the mesh says, and move nothing through the host (the decode loop included); bad input
gets one-line errors."""

import json
import sys

import jax
import pytest

from jaxgrpo import cli
from jaxgrpo import compile as aot
from jaxgrpo import train
from jaxgrpo.config import apply_overrides, load_experiment

TOY = "experiments/toy_sum.py"


def _toy(*overrides):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, list(overrides))
    return cfg


@pytest.fixture(scope="module")
def one_host_report():
    return aot.compile_experiment(_toy("mesh.data=1", "mesh.fsdp=-1"), "v5e:2x4")


def test_toy_programs_fit_a_v5e_8_without_host_transfers(one_host_report):
    report = one_host_report
    assert report.chips == 8 and report.chip == "TPU v5e" and report.mesh == {"data": 1, "fsdp": 8, "model": 1}
    assert [p.program for p in report.programs] == ["prefill", "decode", "forward", "update"]
    for program in report.programs:
        assert program.fits and 0 < program.hbm_bytes < program.hbm_capacity == 16 * aot.GiB
        assert program.host_transfers == []
        assert program.flops > 0 and program.bytes_accessed > 0
        assert program.compiler_seconds is None or program.compiler_seconds > 0
        assert program.model_flops_seconds == pytest.approx(program.model_flops / aot.CHIPS["v5e"].peak_flops)
    prefill, decode, forward, update = report.programs
    # The decode loop's body is one step: it reads at least the parameters and cache a chip holds.
    assert decode.step_floor_seconds > 0 and prefill.step_floor_seconds is None
    # FSDP: the update gathers parameters for the forward and reduces gradients.
    assert update.collectives["all-gather"]["count"] > 0
    assert update.collectives["all-reduce"]["count"] + update.collectives["reduce-scatter"]["count"] > 0
    # 6·N per trained token, split over the chips: one minibatch of 64 rows of prompt + completion slots.
    cfg = _toy()
    tokens = cfg.batch_size * (cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens)
    assert update.model_flops == pytest.approx(6 * report.num_params * tokens / 8)


def test_fsdp_splits_parameters_and_optimizer_state_over_the_chips():
    cfg = _toy("mesh.data=1", "mesh.fsdp=-1")
    chip, devices = aot.topology_devices("v5e:2x4")
    abstract = aot.abstract_train_state(cfg, train.make_mesh(cfg, devices))
    whole = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(abstract.state))
    per_chip = aot.per_chip_bytes(abstract.state)
    # Every matrix divides by 8; only norm scales and scalars (a few hundred bytes) may be replicated.
    assert whole / 8 <= per_chip <= whole / 8 * 1.05
    # Tensor parallelism over 2 chips and FSDP over 4 split it 8 ways too.
    cfg = _toy("mesh.data=1", "mesh.fsdp=4", "mesh.model=2")
    split = aot.per_chip_bytes(aot.abstract_train_state(cfg, train.make_mesh(cfg, devices)).state)
    assert whole / 8 <= split <= whole / 8 * 1.05


def test_toy_programs_fit_a_multi_host_pod():
    report = aot.compile_experiment(_toy("mesh.data=-1", "mesh.fsdp=16", "prompts_per_step=16"), "v5p:4x4x4",
                                    programs=("decode", "update"))
    assert report.chips == 64 and report.hosts == 16 and report.mesh == {"data": 4, "fsdp": 16, "model": 1}
    for program in report.programs:
        assert program.fits and program.host_transfers == [] and program.hbm_capacity == 95 * aot.GiB


def test_report_counts_collectives_and_host_transfers_in_hlo_text():
    text = """
  %ag = bf16[8,128]{1,0} all-gather(bf16[1,128]{1,0} %p), dimensions={0}
  %ars = (f32[4]{0}, f32[2,2]{1,0}) all-reduce-start(f32[4]{0} %a, f32[2,2]{1,0} %b), to_apply=%sum
  %ard = (f32[4]{0}, f32[2,2]{1,0}) all-reduce-done((f32[4]{0}, f32[2,2]{1,0}) %ars)
  %in = (s32[2]{0}, token[]) infeed(token[] %t)
  %cc = f32[] custom-call(), custom_call_target="xla_python_cpu_callback"
"""
    found = aot.collectives(text)
    assert found["all-gather"] == {"count": 1, "bytes": 8 * 128 * 2}
    assert found["all-reduce"] == {"count": 1, "bytes": (4 + 4) * 4}
    assert found["all-to-all"] == {"count": 0, "bytes": 0}
    assert aot.host_transfers(text) == ["infeed", "xla_python_cpu_callback"]


def test_cli_writes_the_report_and_exits_by_whether_it_fits(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = cli.compile_main([TOY, "--topology", "v5e:2x4", "--programs", "forward", "--json", str(out)])
    assert code == 0
    assert "forward  fits" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["topology"] == "v5e:2x4" and saved["programs"][0]["program"] == "forward"


@pytest.mark.parametrize("args, message", [
    (["--topology", "v9z:2x2"], "unknown TPU topology 'v9z:2x2': write GENERATION:SHAPE"),
    (["--topology", "v5e"], "unknown TPU topology 'v5e'"),
    (["--topology", "v5e:3x7"], "libtpu cannot lay out the topology 'v5e:3x7'"),
    (["--topology", "v5e:2x4", "--set", "mesh.data=1", "mesh.fsdp=3"], "does not divide the 8 devices"),
    (["--topology", "v5e:2x4", "--set", "model=no-such-model"], "'no-such-model' is neither a model directory"),
    (["--topology", "v5e:2x4", "--programs", "sampler"], "unknown program(s) sampler; valid: prefill, decode, forward, update"),
])
def test_bad_input_gets_one_line_errors(args, message, capsys):
    assert cli.compile_main([TOY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxgrpo-compile: error: ") and message in err and "\n" not in err, err


def test_missing_libtpu_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` now raises ImportError
    with pytest.raises(RuntimeError, match=r'pip install "jax\[tpu\]==0.10.2"'):
        aot.topology_devices("v5e:2x4")


def test_cpu_kernels_are_never_chosen_for_a_tpu_program():
    """A CPU process compiling for a TPU: the mesh's devices, not the default backend, pick the decoder's kernels."""
    from jaxgrpo.models import cpu_attention, cpu_kernels, cpu_matmul

    _, devices = aot.topology_devices("v5e:2x2")
    tpu = jax.sharding.Mesh(devices[:1], ("data",))
    cpu = jax.sharding.Mesh(jax.devices("cpu")[:1], ("data",))
    assert not cpu_kernels.targets_cpu(tpu) and not cpu_kernels.targets_cpu(tpu.abstract_mesh)
    assert cpu_kernels.targets_cpu(cpu) and cpu_kernels.targets_cpu(cpu.abstract_mesh)
    assert not cpu_matmul.use_for(jax.numpy.bfloat16, tpu.abstract_mesh)
    assert not cpu_attention.use_for(jax.numpy.bfloat16, 64, 1, tpu.abstract_mesh)
    assert cpu_matmul.use_for(jax.numpy.bfloat16, cpu.abstract_mesh) == cpu_matmul.available()
