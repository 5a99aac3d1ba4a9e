"""Parity with transformers: tiny random checkpoints of every family, saved with `save_pretrained`
and loaded with `jaxgrpo.models.load`, give the same logits on a left-padded batch (1e-4, float32)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxgrpo.models import load  # noqa: E402

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def _llama():
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 500000.0}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, rope_parameters=rope))


def _qwen2():
    config = {k: v for k, v in TINY.items() if k != "head_dim"}
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config, tie_word_embeddings=True))


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY))


def _gemma3():
    # Window 4 < sequence 12 so the sliding layers really drop keys; linear RoPE on the global layer.
    config = transformers.Gemma3TextConfig(
        **TINY,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=3.0,
        query_pre_attn_scalar=24,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
    return transformers.Gemma3ForCausalLM(config)


FAMILIES = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "gemma3": _gemma3}


def save_tiny(family: str, directory) -> "torch.nn.Module":
    """A random tiny checkpoint of `family` in `directory`; norms and biases perturbed away from their init."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "bias" in name:
                param.add_(0.3 * torch.randn_like(param))
    model.save_pretrained(directory)
    return model


def left_padded_batch(vocab_size: int, rng: np.random.Generator):
    ids = rng.integers(0, vocab_size, (3, 12))
    mask = np.ones(ids.shape, bool)
    mask[1, :4] = False
    mask[2, :9] = False
    return ids, mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers_on_left_padded_batch(family, tmp_path):
    reference = save_tiny(family, tmp_path)
    model, tokenizer = load(str(tmp_path))
    assert tokenizer is None  # save_pretrained of a bare model writes no tokenizer files

    ids, mask = left_padded_batch(TINY["vocab_size"], np.random.default_rng(0))
    positions = np.maximum(mask.cumsum(1) - 1, 0)
    with torch.no_grad():
        expected = reference(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)), position_ids=torch.tensor(positions)
        ).logits.numpy()
    # Positions are left out on purpose: the decoder derives them from the mask.
    logits = np.asarray(model(jnp.asarray(ids, jnp.int32), attention_mask=jnp.asarray(mask)))
    assert logits.shape == expected.shape
    assert np.abs(logits - expected)[mask].max() <= 1e-4


def test_gemma3_sliding_window_changes_logits(tmp_path):
    """The Gemma parity above is only meaningful if the window drops keys: widening it must change logits."""
    save_tiny("gemma3", tmp_path)
    ids, mask = left_padded_batch(TINY["vocab_size"], np.random.default_rng(0))
    narrow, _ = load(str(tmp_path))
    with open(tmp_path / "config.json") as f:
        config = json.load(f)
    config["sliding_window"] = 64
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    wide, _ = load(str(tmp_path))
    tokens = jnp.asarray(ids, jnp.int32)
    difference = np.abs(np.asarray(narrow(tokens)) - np.asarray(wide(tokens)))
    assert difference[:, :4].max() < 1e-6  # inside the window nothing changes
    assert difference[:, 4:].max() > 1e-3


def test_bfloat16_load_stays_close_to_float32(tmp_path):
    save_tiny("llama", tmp_path)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 128, (2, 10)), jnp.int32)
    full, _ = load(str(tmp_path))
    half, _ = load(str(tmp_path), dtype=jnp.bfloat16)
    assert half.embed[...].dtype == jnp.bfloat16
    logits = half(tokens)
    assert logits.dtype == jnp.float32
    assert np.abs(np.asarray(logits) - np.asarray(full(tokens))).max() < 0.05
