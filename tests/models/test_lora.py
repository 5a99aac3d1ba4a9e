"""LoRA and QLoRA with qwix (`jaxgrpo.models.lora`, `Config.lora`): the adapted model starts as the base, only
the adapters train and are checkpointed, the KL reference is the base, quantized forwards stay near float, the
sampler and the trainer agree, a run resumes exactly after SIGKILL, and its adapters load into peft."""

import dataclasses
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo.config import LORA_TARGETS, apply_overrides, load_experiment
from jaxgrpo.data import toy
from jaxgrpo.models import Decoder, lora
from jaxgrpo.models.config import PROJECTIONS
from jaxgrpo.run.metrics import read_jsonl
from jaxgrpo.train import Trainer
from tests.support.tiny_models import llama_and_gemma3

from tests.support import kill_resume
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOY = os.path.join(ROOT, "experiments", "toy_sum.py")
FAMILIES = llama_and_gemma3(sliding_window=3)
TOKENS = np.array([[5, 9, 2, 33, 17, 8, 40, 1], [3, 3, 60, 12, 7, 25, 4, 44]], np.int32)


def logits(model, tokens=TOKENS):
    """The model's logits under jit, as the trainer and the sampler run it."""
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(tokens)))


def set_adapters(model, scale: float = 0.05, seed: int = 1, only=None):
    """Every adapter B of `model` (or those of the targets in `only`; the others to zero) to random values (as
    after training): the adapters then change the output."""
    for i, name in enumerate(lora.settings(model).targets):
        b = getattr(getattr(model.layers, PROJECTIONS[name].module), f"{name}_lora_b")
        on = only is None or name in only
        b[...] = scale * jax.random.normal(jax.random.key(seed + i), b[...].shape) if on else jnp.zeros_like(b[...])
    return model


def test_targets_are_the_decoders_projections():
    assert LORA_TARGETS == lora.TARGETS == tuple(PROJECTIONS)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_with_b_zero_the_adapted_logits_equal_the_base(family):
    """B starts at zero, so each adapted product adds exactly 0: the base's logits, to a float32 rounding (the
    adapted graph is another program, which XLA may compile differently: at LLVM -O1 gemma3's logits moved by
    1.2e-7, one unit in the last place, against bit-equal at -O2). Each target's
    adapter is in the graph: a nonzero B of any one of them changes the logits. Checked on two models adapting
    half the targets each (a module's other projections unadapted, as with a single target), one compiled
    forward per model with one target's B nonzero at a time."""
    model = Decoder(FAMILIES[family], rngs=nnx.Rngs(0))
    adapted = lora.apply(model, rank=4, alpha=8.0, targets=LORA_TARGETS)
    base = logits(model)
    np.testing.assert_allclose(logits(adapted), base, rtol=0, atol=1e-6)
    for subset in (LORA_TARGETS[0::2], LORA_TARGETS[1::2]):
        partial = lora.apply(model, rank=4, alpha=8.0, targets=subset)
        graphdef, _ = nnx.split(partial)
        forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
        for name in subset:
            state = nnx.state(set_adapters(partial, only=(name,)))
            assert np.abs(np.asarray(forward(state, jnp.asarray(TOKENS))) - base).max() > 1e-4, \
                f"adapter of {name} has no effect"


def test_only_the_named_targets_get_adapters():
    model = Decoder(FAMILIES["llama"], rngs=nnx.Rngs(0))
    adapted = lora.apply(model, rank=2, alpha=4.0, targets=("q", "down"))
    names = {path[-1] for path, _ in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam))}
    assert names == {"q_lora_a", "q_lora_b", "down_lora_a", "down_lora_b"}
    # A [layers, *contracted, r], B [layers, r, *out], as qwix shapes them for the product.
    assert adapted.layers.attn.q_lora_a[...].shape == (2, 32, 2) and adapted.layers.attn.q_lora_b[...].shape == (2, 2, 4, 8)
    assert adapted.layers.mlp.down_lora_a[...].shape == (2, 48, 2) and adapted.layers.mlp.down_lora_b[...].shape == (2, 2, 32)


def toy_config(tmp_path, *overrides):
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [f"run_dir={tmp_path / 'run'}", "task.num_eval_examples=0", "checkpoint_every=0",
                          "prompts_per_step=4", "group_size=4", "lora.rank=4", "lora.alpha=8.0", *overrides])
    return cfg


@pytest.fixture(scope="module")
def two_lora_steps(tmp_path_factory):
    """A LoRA toy run of two steps with a KL term (lr 3e-2, so the adapters move the policy visibly), shared by the
    tests of what it trains and of its reference: (trainer, its records, its base weights (the read-only `rest`)
    and adapters before the run, both as numpy)."""
    cfg = toy_config(tmp_path_factory.mktemp("two_lora_steps"), "steps=2", "warmup_sft_steps=0", "kl_coef=0.1",
                     "optimizer.lr=3e-2")
    trainer = Trainer(cfg)
    base = jax.tree.map(np.asarray, trainer.rest)
    before = jax.tree.map(np.asarray, trainer.state.params)
    history = trainer.run(progress=False)
    return trainer, history, base, before


@pytest.fixture(scope="module")
def base_trainer(tmp_path_factory):
    """The toy run's base model without LoRA, untouched (a frozen copy of what every LoRA trainer here adapts)."""
    return Trainer(toy_config(tmp_path_factory.mktemp("base"), "lora=none", "kl_coef=0.1", "warmup_sft_steps=0"))


def test_gradients_reach_only_the_adapters(two_lora_steps):
    """The train state holds the adapters alone (and their Adam moments); after two updates every adapter has moved
    (its gradient reached it) and every base weight is bit for bit what it was. Two: at the first, B is zero, so
    A's gradient (x^T dy B^T) is exactly zero and only B moves."""
    trainer, history, base, before = two_lora_steps
    trained = nnx.to_flat_state(trainer.state.params)
    assert trained and all(str(path[-1]).endswith(("_lora_a", "_lora_b")) for path, _ in trained)
    moments = [x for x in jax.tree.leaves(trainer.state.opt_state) if x.ndim]
    assert sorted(x.shape for x in moments) == sorted(2 * [v.get_value().shape for _, v in trained])
    assert all(record["grad_norm"] > 0 for record in history)
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, jax.tree.map(np.asarray, trainer.state.params))
    assert all(jax.tree.leaves(moved)), "an adapter did not move"
    jax.tree.map(np.testing.assert_array_equal, base, jax.tree.map(np.asarray, trainer.rest))


def test_reference_with_the_adapters_off_equals_a_frozen_copy(two_lora_steps, base_trainer):
    """After two steps the policy differs from the base, and the KL reference the trainer scores (the same graph with
    every adapter zero) equals a separately built frozen copy of the base model's log-probs."""
    trainer, history, _, _ = two_lora_steps
    assert trainer.loop_state.reference is None  # no second copy of anything
    assert history[-1]["kl"] > 0
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(7))
    tokens = np.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1).astype(np.int32)
    attention = np.concatenate([rollout.prompt_mask, rollout.completion_mask > 0], axis=1)
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
    completion = rollout.completion_tokens.shape[1]
    mask = rollout.completion_mask > 0
    reference = trainer.logprobs(trainer.reference(trainer.loop_state), tokens, attention, positions, completion)
    policy = trainer.logprobs(trainer.state.params, tokens, attention, positions, completion)
    assert np.abs(policy - reference)[mask].max() > 1e-3  # the adapters have moved the policy
    frozen = base_trainer.logprobs(base_trainer.state.params, tokens, attention, positions, completion)
    np.testing.assert_array_equal(reference[mask], frozen[mask])


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """RMS of the difference over the RMS of the exact values' deviation from their mean."""
    return float(np.sqrt(np.mean((approx - exact) ** 2)) / np.std(exact))


# How far a quantized base may move from float on tiny random models (weights N(0, 0.02)), as relative RMS errors.
# A weight: int8 with a per-output-channel absmax scale over a contracted axis of n = 128 (absmax ~ 3 sigma) rounds
# with an error of RMS 3 sigma / 127 / sqrt(12) ~ 0.7% of the weights'; NF4 in blocks of 64 (16 levels at the
# normal's quantiles, QLoRA's data type) ~ 9% (measured 0.65% and 9.2%, on every seed and family tried). Bounds: 1%
# and 12%. The logits: each of a layer's 7 products adds its weights' relative error to its output, and the errors
# of the 14 products of two layers compound (Gemma's post-norms give each branch the residual's full scale), so
# the logits' relative error measured 2-3x the weights' (int8 1.2-1.9%, nf4 17-28% over 3 seeds x 2 families).
# Bounds: 4x the weights' bounds. A broken quantization (a scale on the wrong axis, a block mixed up) is off by
# order 100%, and nf4 must lose more than int8.
WEIGHT_TOLERANCE = {"int8": 0.01, "nf4": 0.12}
LOGIT_TOLERANCE = {"int8": 0.04, "nf4": 0.48}


@pytest.mark.parametrize("qtype", sorted(WEIGHT_TOLERANCE))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_quantized_forward_stays_within_its_tolerance_of_float(family, qtype):
    config = dataclasses.replace(FAMILIES[family], hidden_size=128, intermediate_size=256, head_dim=64)
    model = Decoder(config, rngs=nnx.Rngs(0))
    exact = logits(model)
    adapted = lora.apply(model, rank=4, alpha=8.0, quantize_base=qtype)
    for name, projection in PROJECTIONS.items():
        weight = getattr(getattr(adapted.layers, projection.module), name)
        assert lora.is_quantized(weight), name
        original = getattr(getattr(model.layers, projection.module), name)[...]
        error = relative_error(np.asarray(lora.dequantized(weight)), np.asarray(original))
        assert 0 < error < WEIGHT_TOLERANCE[qtype], (name, error)
    error = relative_error(logits(adapted), exact)
    assert 0 < error < LOGIT_TOLERANCE[qtype], error
    if qtype == "nf4":  # 4 bits lose more than 8: the tolerance is not loose enough to hide a mix-up
        assert error > relative_error(logits(lora.apply(model, rank=4, alpha=8.0, quantize_base="int8")), exact)


@pytest.mark.parametrize("quantize_base", [None, "nf4"])
def test_sampler_and_trainer_log_probs_agree_under_lora(quantize_base, tmp_path, base_trainer):
    """With trained-looking adapters (B nonzero), the sampler's log-probs of its own tokens equal the trainer's
    recomputation (padded rows, and the update's packed rows: its `logp_gap`) within 1e-5."""
    cfg = toy_config(tmp_path, "steps=1", "warmup_sft_steps=0", "sampling.max_new_tokens=6",
                     f"lora.quantize_base={quantize_base or 'none'}")
    trainer = Trainer(cfg)
    for i, (path, variable) in enumerate(nnx.to_flat_state(trainer.state.params)):
        if path[-1].endswith("_lora_b"):  # as after training: the adapters change the policy
            value = variable.get_value()
            variable.set_value(jax.device_put(0.2 * jax.random.normal(jax.random.key(i), value.shape), value.sharding))
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(3))
    tokens = np.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1).astype(np.int32)
    attention = np.concatenate([rollout.prompt_mask, rollout.completion_mask > 0], axis=1)
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
    mask = rollout.completion_mask > 0
    recomputed = trainer.logprobs(trainer.state.params, tokens, attention, positions, rollout.completion_tokens.shape[1])
    unadapted = base_trainer.logprobs(base_trainer.state.params, tokens, attention, positions, rollout.completion_tokens.shape[1])
    assert np.abs(recomputed - unadapted)[mask].max() > 1e-2  # the adapters matter here
    assert np.abs(recomputed - rollout.sampler_logp)[mask].max() < 1e-5
    record = trainer.run(progress=False)[0]
    assert record["logp_gap"] < 1e-5



def test_a_non_finite_lora_update_is_skipped_keeping_the_adapters_bit_for_bit(tmp_path, monkeypatch):
    """A NaN loss at step 2 (NaN advantages) is not applied to the adapters or their optimizer state, and counted
    (`skipped_nonfinite`); step 3 trains again from step 1's adapters, and the base never changes."""
    trainer = Trainer(toy_config(tmp_path, "steps=3", "warmup_sft_steps=0", "optimizer.lr=1e-2"))
    real, calls = Trainer.advantages, []

    def advantages(self, state, rollout, stats=None, metrics=None):
        batch = real(self, state, rollout, stats, metrics)
        calls.append(1)
        return batch._replace(advantages=np.full_like(batch.advantages, np.nan)) if len(calls) == 2 else batch

    monkeypatch.setattr(Trainer, "advantages", advantages)
    base = jax.tree.map(np.array, trainer.rest)
    states = {}
    history = trainer.run(progress=False, on_step=lambda step, record: states.__setitem__(
        step, jax.tree.map(np.array, trainer.state)))
    assert [r["skipped_nonfinite"] for r in history] == [0, 1, 0]
    jax.tree.map(np.testing.assert_array_equal, states[1], states[2])
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(states[3].params))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(states[2].params),
                                                        jax.tree.leaves(states[3].params)))
    jax.tree.map(np.testing.assert_array_equal, base, jax.tree.map(np.array, trainer.rest))


@pytest.mark.parametrize("quantize_base", [None, "nf4"])
@pytest.mark.usefixtures("users_matmul_precision")
def test_compiled_for_a_tpu_the_programs_train_the_adapters_and_take_the_base_as_input(quantize_base):
    """`jaxgrpo-compile` of a LoRA run (the rollout engine's programs and the update): the trained parameters are the
    adapters, the report names the settings, and the update's inputs hold the read-only base (its weights are
    program arguments, not constants folded in)."""
    from jaxgrpo import train
    from jaxgrpo.tools import compile as aot

    cfg = load_experiment(TOY)
    apply_overrides(cfg, ["lora.rank=4", "lora.alpha=8.0", f"lora.quantize_base={quantize_base or 'none'}"])
    report = aot.compile_experiment(cfg, "v5e:2x4", programs=("engine", "update"))
    model, _ = train.build_model(cfg)
    adapted = train.adapt(model, cfg)
    assert report.num_trained == lora.num_adapter_params(adapted)
    mesh = train.make_mesh(cfg, aot.topology_devices("v5e:2x4")[1])
    full = aot.abstract_train_state(apply_overrides(load_experiment(TOY), ["lora=none"]), mesh)
    assert report.num_params == full.num_params + report.num_trained
    assert report.lora == {"rank": 4, "alpha": 8.0, "targets": LORA_TARGETS, "quantize_base": quantize_base}
    assert "LoRA rank 4" in report.table()
    *engine, update = report.programs
    assert len(engine) == 3 and all(p.error is None and p.fits for p in report.programs)
    abstract = aot.abstract_train_state(cfg, mesh)
    assert update.argument_bytes >= aot.per_chip_bytes(abstract.rest) + aot.per_chip_bytes(abstract.state)

#: 4 steps with a checkpoint each; the killed run dies once step 2 is on disk.
_RESUME_OVERRIDES = ["steps=4", "checkpoint_every=1", "warmup_sft_steps=2", "eval_every=0", "kl_coef=0.05",
                     "task.num_eval_examples=0", "lora.rank=4", "lora.alpha=8.0", "lora.quantize_base=int8"]


# Slow tier (`-m slow`); in CI instead: SIGKILL and resume: test_trainer.py; a LoRA checkpoint's contents:
# test_a_lora_checkpoint_holds_only_the_adapters
@pytest.mark.slow
def test_resume_after_sigkill_is_exact_under_lora(tmp_path):
    """QLoRA (int8 base) with a warm-up and a KL term: 4 steps straight == 2 steps, SIGKILL, --resume to 4 (same
    adapters, same metrics for steps 3-4). The checkpoints hold the adapters, their Adam moments and the warmed-up
    reference adapters, nothing of the base."""
    script = kill_resume.experiment_script(TOY, _RESUME_OVERRIDES, kill_after=2)
    straight, killed, steps_at_kill = kill_resume.straight_and_killed(tmp_path, script)
    assert steps_at_kill == 2
    assert [r["step"] for r in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    assert kill_resume.comparable(straight)[2:] == kill_resume.comparable(killed)[2:]
    a, b = kill_resume.checkpoint(straight, 4), kill_resume.checkpoint(killed, 4)
    jax.tree.map(np.testing.assert_array_equal, a["train"]["params"], b["train"]["params"])
    names = {_variable_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(a["train"]["params"])}
    assert len(names) == 14 and all(n.endswith(("_lora_a", "_lora_b")) for n in names), names
    assert {_variable_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(a["ref"])} == names


def _variable_name(path) -> str:
    """The variable an array of a saved nnx state is the value of ('q_lora_a' of .../attn/q_lora_a/value)."""
    keys = [str(getattr(k, "key", k)) for k in path]
    return keys[-2] if keys[-1] == "value" else keys[-1]


# -- a LoRA run on a Hugging Face model: its checkpoint, its PEFT export -------------------------------------------

#: A random Llama wide enough that a model's weights dwarf rank-4 adapters (1.2M parameters against 33k).
WIDE_LLAMA = dict(family="llama", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=64)


@pytest.fixture(scope="module")
def hf_lora_run(tmp_path_factory):
    """A random Llama saved as a Hugging Face directory (the base), and a 3-step LoRA run on it with a checkpoint
    each step: (run directory, base directory, the trained `Trainer`)."""
    from jaxgrpo.models import DecoderConfig
    from jaxgrpo.tools import export

    root = tmp_path_factory.mktemp("hf_lora")
    tokenizer = toy.CharTokenizer()
    model = Decoder(DecoderConfig(vocab_size=tokenizer.vocab_size, **WIDE_LLAMA), rngs=nnx.Rngs(0))
    export.export_model(model, tokenizer, str(root / "base"))
    cfg = toy_config(root, f"model={root / 'base'}", "steps=3", "checkpoint_every=1", "warmup_sft_steps=0",
                     "optimizer.lr=1e-2")
    trainer = Trainer(cfg)
    trainer.run(progress=False)
    return root / "run", root / "base", trainer


def _array_bytes(step) -> int:
    """Bytes of the arrays a checkpoint step holds, from its checksum manifest (shapes and dtypes)."""
    from jaxgrpo.run.checkpoint import CHECKSUMS

    with open(os.path.join(step, CHECKSUMS, "metadata")) as f:
        arrays = json.load(f)["arrays"]
    return sum(math.prod(a["shape"]) * np.dtype(a["dtype"]).itemsize for a in arrays.values())


def _directory_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_a_lora_checkpoint_holds_only_the_adapters(hf_lora_run, tmp_path, capsys):
    """The checkpoint holds the adapters and their Adam moments, each with its checksum, and nothing of the base:
    its arrays are under a tenth of a full fine-tune's checkpoint's of the same model (the adapters are 2.8% of its
    weights), written the same way. That full fine-tune has no adapters to export: --peft is one line, exit 2."""
    from jaxgrpo.run.checkpoint import CHECKSUMS
    from jaxgrpo.tools import cli

    run_dir, base_dir, trainer = hf_lora_run
    weights = nnx.state(trainer.policy.decoder, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    assert lora.num_adapter_params(trainer.policy.decoder) < 0.03 * sum(x.size for x in jax.tree.leaves(weights))
    step = run_dir / "checkpoints" / "3"
    with open(step / CHECKSUMS / "metadata") as f:
        arrays = json.load(f)["arrays"]
    saved = [name for name, entry in arrays.items() if math.prod(entry["shape"]) > 1]
    assert len(saved) == 3 * 14  # 7 projections' A and B, with their two Adam moments
    assert all(re.search(r"/\w+_lora_[ab]/", name) for name in saved), saved

    full = toy_config(tmp_path, f"model={base_dir}", "lora=none", "steps=1", "checkpoint_every=1",
                      "warmup_sft_steps=0")
    Trainer(full).run(progress=False)
    lora_bytes, full_bytes = _array_bytes(step), _array_bytes(tmp_path / "run" / "checkpoints" / "1")
    assert lora_bytes < 0.1 * full_bytes, (lora_bytes, full_bytes)
    # On disk too, where the tiny model's per-array metadata (the same for every array) weighs in.
    assert _directory_bytes(step) < 0.2 * _directory_bytes(tmp_path / "run" / "checkpoints" / "1")
    capsys.readouterr()
    assert cli.export_main([str(tmp_path / "run"), "--peft", "--out", str(tmp_path / "adapters")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "trained every parameter (its config has no lora)" in err, err
    assert not (tmp_path / "adapters").exists()


def _hf_logits(model, ids, mask):
    import torch

    positions = np.maximum(mask.cumsum(1) - 1, 0)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                     position_ids=torch.tensor(positions)).logits.numpy()


def test_peft_export_loaded_with_peft_gives_our_logits(hf_lora_run, tmp_path, capsys):
    """`jaxgrpo-export --peft` writes the adapters in PEFT's format; `peft` loads them onto the base with
    transformers and gives the adapted policy's logits within 1e-4 (float32), while the base alone is visibly
    off them. `--base` writes that base back unchanged."""
    import torch
    import transformers

    import peft  # pinned in setup.py's test extras

    from jaxgrpo.tools import cli

    run_dir, base_dir, trainer = hf_lora_run
    assert cli.export_main([str(run_dir), "--peft", "--out", str(tmp_path / "adapters")]) == 0
    assert "peft.PeftModel.from_pretrained" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "adapters")) == ["adapter_config.json", "adapter_model.safetensors"]
    assert cli.export_main([str(run_dir), "--base", "--out", str(tmp_path / "base")]) == 0

    rng = np.random.default_rng(0)
    ids = rng.integers(3, trainer.policy.decoder.config.vocab_size, (3, 12))
    mask = np.ones(ids.shape, bool)
    mask[1, :5] = False  # left padding, as the sampler lays prompts out
    ours = np.asarray(trainer.policy.decoder(jnp.asarray(ids, jnp.int32), attention_mask=jnp.asarray(mask)))

    base = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    base_logits = _hf_logits(base, ids, mask)
    assert np.abs(base_logits - ours)[mask].max() > 1e-2  # the trained adapters change the logits
    exported_base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
    np.testing.assert_array_equal(_hf_logits(exported_base.eval(), ids, mask), base_logits)

    adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapters")).eval()
    assert np.abs(_hf_logits(adapted, ids, mask) - ours)[mask].max() <= 1e-4



@pytest.mark.parametrize("quantize_base", ["int8", "nf4"])
def test_a_qlora_models_exports_give_its_logits(quantize_base, tmp_path):
    """Under QLoRA the merged export (W dequantized + (alpha / r) A B) and the PEFT adapters on the exported base
    (W dequantized) give the quantized model's own logits within 1e-4 in transformers: what was trained is what
    is exported, not the float base it was quantized from."""
    import peft
    import torch
    import transformers

    from jaxgrpo.models import DecoderConfig
    from jaxgrpo.tools import export

    tokenizer = toy.CharTokenizer()
    model = Decoder(DecoderConfig(vocab_size=tokenizer.vocab_size, **WIDE_LLAMA), rngs=nnx.Rngs(0))
    adapted = set_adapters(lora.apply(model, rank=4, alpha=8.0, quantize_base=quantize_base), scale=0.2)
    export.export_model(adapted, tokenizer, str(tmp_path / "merged"))
    export.export_model(adapted, tokenizer, str(tmp_path / "base"), adapters=False)
    export.export_adapters(adapted, str(tmp_path / "adapters"), base_model=str(tmp_path / "base"))

    rng = np.random.default_rng(1)
    ids = rng.integers(3, tokenizer.vocab_size, (2, 10))
    mask = np.ones(ids.shape, bool)
    ours = np.asarray(adapted(jnp.asarray(ids, jnp.int32)))
    assert np.abs(ours - np.asarray(model(jnp.asarray(ids, jnp.int32)))).max() > 1e-2  # quantized and adapted

    def load(directory):
        return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()

    assert np.abs(_hf_logits(load(tmp_path / "merged"), ids, mask) - ours).max() <= 1e-4
    with_adapters = peft.PeftModel.from_pretrained(load(tmp_path / "base"), str(tmp_path / "adapters")).eval()
    assert np.abs(_hf_logits(with_adapters, ids, mask) - ours).max() <= 1e-4

# -- bad input: one line, before anything is built ----------------------------------------------------------------

BAD_LORA = {
    "lora.rank=0": "lora.rank must be >= 1 (the adapters' inner dimension), got 0",
    "lora.rank=-2": "lora.rank must be >= 1 (the adapters' inner dimension), got -2",
    "lora.alpha=0": "lora.alpha must be > 0 (the adapters are scaled by alpha / rank), got 0.0",
    "lora.alpha=-8": "lora.alpha must be > 0 (the adapters are scaled by alpha / rank), got -8.0",
    "lora.targets=('q','qkv_proj')": "lora.targets has 'qkv_proj', which is not a projection of the decoder; valid "
                                     "targets: q, k, v, o, gate, up, down",
    "lora.targets=()": "lora.targets is empty",
    "lora.targets=('q','q')": "lora.targets names a projection twice: q, q",
    "lora.quantize_base=int4": "lora.quantize_base must be none (the base as loaded) or one of 'int8', 'nf4' (the base "
                               "stored quantized by qwix), got 'int4'",
}


@pytest.mark.parametrize("override", sorted(BAD_LORA))
def test_validate_rejects_bad_lora_settings_in_one_line(override):
    from jaxgrpo.config import Config, validate
    from jaxgrpo.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        validate(apply_overrides(Config(), [override]))
    assert "\n" not in str(error.value) and BAD_LORA[override] in str(error.value)


@pytest.mark.parametrize("override", ["lora.rank=0", "lora.quantize_base=int4"])
def test_jaxgrpo_train_rejects_bad_lora_settings_in_one_line(override, tmp_path, monkeypatch, capsys):
    """From the command line: `jaxgrpo-train: error: ...`, exit 2, no trainer built and no run directory."""
    import jaxgrpo.train.loop
    from jaxgrpo.tools.cli import train_main

    def no_trainer(*args, **kwargs):
        raise AssertionError("the Trainer was built for a config that should have been rejected")

    monkeypatch.setattr(jaxgrpo.train.loop, "Trainer", no_trainer)
    monkeypatch.chdir(tmp_path)
    assert train_main([os.path.join(ROOT, "experiments", "lora.py"), "--set", override]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error: ") and BAD_LORA[override] in lines[0], lines
    assert out == "" and not (tmp_path / "runs").exists()
