"""`load(source) -> (model, tokenizer)` for Hugging Face directories, GGUF files and registered names."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgrpo.models import registry
from jaxgrpo.models.config import DecoderConfig, from_gguf_metadata, from_hf_config
from jaxgrpo.models.decoder import Decoder
from jaxgrpo.models.tokenizer import load_tokenizer, tokenizer_from_gguf_metadata
from jaxgrpo.models.weights import WeightFileError, decoder_params, read_gguf, read_safetensors


def decoder_from_params(config: DecoderConfig, params, *, dtype=jnp.float32, remat: bool = False) -> Decoder:
    """A `Decoder` whose parameters are `params` (nested dict of arrays, cast to `dtype`)."""
    abstract = nnx.eval_shape(lambda: Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda x: jnp.asarray(x, dtype), params))
    return nnx.merge(graphdef, state)


def _resolve(source) -> str:
    """The checkpoint path of a directory, a `.gguf` file or a registered name."""
    path = os.fspath(source)
    if not os.path.exists(path) and not path.endswith(".gguf") and os.sep not in path:
        path = registry.resolve(path)
    return path


def load_config(source: str) -> DecoderConfig:
    """The architecture of a checkpoint (as `load` takes it), without reading its weights: enough to build the
    model from shapes alone, e.g. to compile its programs ahead of time."""
    path = _resolve(source)
    if path.endswith(".gguf"):
        from gguf import GGUFReader

        if not os.path.exists(path):
            raise WeightFileError(f"GGUF file {path} does not exist")
        reader = GGUFReader(path)
        tensors = {t.name: t for t in reader.tensors}
        if "token_embd.weight" not in tensors:
            raise WeightFileError(f"{path}: tensor 'token_embd.weight' is missing")
        metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        # gguf-py gives shapes in ggml's order, fastest axis first: the vocabulary is the last.
        return from_gguf_metadata(metadata, vocab_size=int(tensors["token_embd.weight"].shape[-1]),
                                  tie_word_embeddings="output.weight" not in tensors)
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise WeightFileError(f"{config_path} is missing: a model directory needs config.json")
    with open(config_path) as f:
        return from_hf_config(json.load(f))


def load(source: str, dtype=jnp.float32, *, remat: bool = False):
    """Load a checkpoint: `(Decoder, tokenizer or None)`.

    Args:
      source: a Hugging Face model directory (config.json + safetensors), a `.gguf` file, or a
        name in `registry.registered_names()` (e.g. `smollm2-135m-instruct`, `gemma3-270m`).
      dtype: parameter and compute dtype (float32 or bfloat16).
      remat: rematerialize each layer in the backward pass.

    A directory without tokenizer files loads with tokenizer None.
    """
    path = _resolve(source)
    if path.endswith(".gguf"):
        metadata, tensors = read_gguf(path)
        if "model.embed_tokens.weight" not in tensors:
            raise WeightFileError(f"{path}: tensor 'token_embd.weight' is missing")
        config = from_gguf_metadata(
            metadata,
            vocab_size=tensors["model.embed_tokens.weight"].shape[0],
            tie_word_embeddings="lm_head.weight" not in tensors,
        )
    elif os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        if not os.path.exists(config_path):
            raise WeightFileError(f"{config_path} is missing: a model directory needs config.json and safetensors weights")
        with open(config_path) as f:
            config = from_hf_config(json.load(f))
        tensors = read_safetensors(path)
    else:
        raise WeightFileError(f"{path} does not exist (expected a model directory, a .gguf file or a registered name)")
    model = decoder_from_params(config, decoder_params(tensors, config, path), dtype=dtype, remat=remat)
    tokenizer = tokenizer_from_gguf_metadata(metadata, path) if path.endswith(".gguf") else load_tokenizer(path)
    return model, tokenizer
