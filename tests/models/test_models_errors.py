"""Bad input fails loudly, naming the problem: unsupported architectures and config fields,
missing or corrupt weight files, out-of-vocabulary tokens."""

import dataclasses
import json

import jax.numpy as jnp
import pytest
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig, UnsupportedConfigError, WeightFileError, load
from jaxgrpo.models.config import from_hf_config
from jaxgrpo.models.paged_cache import PagedKVCache, PagedRows
from tests.support.tiny_models import write_hf_checkpoint

LLAMA = {
    "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6,
}


def _write_checkpoint(directory, config=LLAMA, drop=()):
    write_hf_checkpoint(directory, config, drop=drop)


def test_well_formed_checkpoint_loads(tmp_path):
    _write_checkpoint(tmp_path)
    model, tokenizer = load(str(tmp_path))
    assert model(jnp.zeros((1, 3), jnp.int32)).shape == (1, 3, 32)
    assert tokenizer is None


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedConfigError, match="unsupported architecture 'mistral'; supported: llama, qwen2, qwen3, gemma3_text"):
        from_hf_config({**LLAMA, "model_type": "mistral"})


@pytest.mark.parametrize(
    "field, message",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not implemented; supported: default, linear, llama3"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        ({"mlp_bias": True}, "mlp_bias=True is not supported"),
        ({"hidden_act": "gelu"}, "hidden activation='gelu' is not supported"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
    ],
)
def test_unsupported_config_fields_raise(field, message):
    with pytest.raises(UnsupportedConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_hf_config({**LLAMA, **field})


def test_gemma_attention_softcapping_is_refused():
    gemma = {**LLAMA, "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0}
    with pytest.raises(UnsupportedConfigError, match="attn_logit_softcapping=50.0 is not supported"):
        from_hf_config(gemma)


def test_missing_weight_file_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(WeightFileError, match=f"{tmp_path}/model.safetensors is missing"):
        load(str(tmp_path))


def test_corrupt_weight_file_is_named(tmp_path):
    _write_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(WeightFileError, match=f"cannot read weight file {tmp_path}/model.safetensors"):
        load(str(tmp_path))


def test_missing_tensor_is_named(tmp_path):
    _write_checkpoint(tmp_path, drop=("model.layers.0.mlp.up_proj.weight",))
    with pytest.raises(WeightFileError, match="tensor 'model.layers.0.mlp.up_proj.weight' is missing"):
        load(str(tmp_path))


def test_corrupt_gguf_is_named(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(WeightFileError, match=f"cannot read GGUF file {path}"):
        load(str(path))


def test_unknown_source_lists_registered_names():
    with pytest.raises(KeyError, match="registered: gemma3-270m, smollm2-135m-instruct"):
        load("no-such-model")


def test_out_of_vocabulary_tokens_raise_in_eager_use():
    config = DecoderConfig(family="llama", vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8)
    # The check runs before any computation, so abstract parameters suffice.
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\).*max 32"):
        model(jnp.array([[1, 32]], jnp.int32))
    with pytest.raises(ValueError, match=r"min -1"):
        model(jnp.array([[-1, 3]], jnp.int32))


def _paged_rows(rows, *, layers=1, blocks=4, kv_heads=1, block_size=4, head_dim=8, max_blocks=2):
    pool = jnp.zeros((layers, blocks, kv_heads, block_size, head_dim))
    zeros = jnp.zeros((rows,), jnp.int32)
    return PagedRows(PagedKVCache(pool, pool), jnp.zeros((rows, max_blocks), jnp.int32), zeros, zeros)


@pytest.mark.parametrize("sliding, cache_rows, prefix_rows, message", [
    (False, 3, None, "the paged cache has 3 rows for 4 rows of tokens"),
    (False, 4, 3, "a shared prefix of 3 rows for 4 rows of tokens: its rows must divide them"),
    (True, 4, 2, r"a shared prefix of 2 rows for 4 rows of tokens with a sliding window \(4\): rows sharing a prefix "
                 "row sit at different distances from it; give each row its whole table, no prefix"),
])
def test_a_paged_decode_step_refuses_rows_it_cannot_read(sliding, cache_rows, prefix_rows, message):
    fields = {"sliding_window": 4, "layer_types": ["sliding_attention"]} if sliding else {}
    model = Decoder(dataclasses.replace(from_hf_config(LLAMA), **fields), rngs=nnx.Rngs(0))
    prefix = None if prefix_rows is None else _paged_rows(prefix_rows)
    with pytest.raises(ValueError, match=message):
        model.paged_decode_step(jnp.zeros((4, 1), jnp.int32), cache=_paged_rows(cache_rows), prefix=prefix)
