"""`load(source) -> (model, tokenizer)` for Hugging Face directories, GGUF files, registered names and published
architectures (`jaxgrpo.models.architectures`: their weights from `$JAXGRPO_MODELS/<name>`)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgrpo.models import architectures, registry
from jaxgrpo.models.config import DecoderConfig, from_gguf_metadata, from_hf_config
from jaxgrpo.models.decoder import Decoder
from jaxgrpo.models.tokenizer import load_tokenizer, tokenizer_from_gguf_metadata
from jaxgrpo.models.weights import (WeightFileError, decoder_params, language_model_tensors, open_gguf, read_gguf,
                                    read_safetensors)


def decoder_from_params(config: DecoderConfig, params, *, dtype=jnp.float32, remat: bool = False,
                        attention: str = "auto") -> Decoder:
    """A `Decoder` whose parameters are `params` (nested dict of arrays, cast to `dtype`), with the
    attention implementation `attention` (`jaxgrpo.models.attention`)."""
    abstract = nnx.eval_shape(lambda: Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, attention=attention,
                                              rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda x: jnp.asarray(x, dtype), params))
    return nnx.merge(graphdef, state)


def _is_name(path: str) -> bool:
    return not os.path.exists(path) and not path.endswith(".gguf") and os.sep not in path


def _resolve(source) -> str:
    """The checkpoint path of a directory, a `.gguf` file, a registered name or a published architecture."""
    path = os.fspath(source)
    if not _is_name(path):
        return path
    if path in registry.registered_names():
        return registry.resolve(path)
    if path in architectures.ARCHITECTURES:
        return architectures.weights_dir(path)
    raise KeyError(
        f"{path!r} is neither a model directory, a .gguf file, a registered name nor a published architecture; "
        f"registered: {', '.join(registry.registered_names())}; architectures: {', '.join(architectures.names())}")


def _read_hf_config(path: str) -> tuple[DecoderConfig, bool]:
    """(the decoder's config, whether the checkpoint is image-text) from a model directory's config.json; of an
    image-text Gemma 3 the config is its text decoder's."""
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise WeightFileError(f"{config_path} is missing: a model directory needs config.json and safetensors weights")
    with open(config_path) as f:
        config = json.load(f)
    text = architectures.text_decoder_config(config)
    return from_hf_config(text), text is not config


def load_config(source: str) -> DecoderConfig:
    """The architecture of a checkpoint (as `load` takes it), without reading its weights: enough to build the
    model from shapes alone, e.g. to compile its programs ahead of time."""
    path = os.fspath(source)
    if _is_name(path) and path in architectures.ARCHITECTURES and path not in registry.registered_names():
        return architectures.decoder_config(path)
    path = _resolve(path)
    if path.endswith(".gguf"):
        metadata, gguf_tensors = open_gguf(path)
        tensors = {t.name: t for t in gguf_tensors}
        if "token_embd.weight" not in tensors:
            raise WeightFileError(f"{path}: tensor 'token_embd.weight' is missing")
        # Shapes in ggml's order, fastest axis first: the vocabulary is the last.
        return from_gguf_metadata(metadata, vocab_size=int(tensors["token_embd.weight"].shape[-1]),
                                  tie_word_embeddings="output.weight" not in tensors)
    return _read_hf_config(path)[0]


def load(source: str, dtype=jnp.float32, *, remat: bool = False, attention: str = "auto"):
    """Load a checkpoint: `(Decoder, tokenizer or None)`.

    Args:
      source: a Hugging Face model directory (config.json + safetensors), a `.gguf` file, a name in
        `registry.registered_names()` (e.g. `smollm2-135m-instruct`, `gemma3-270m`), or a published
        architecture's name (`architectures.names()`, e.g. `qwen3-0.6b`), whose weights are read from
        `$JAXGRPO_MODELS/<name>` (see `jaxgrpo.models.architectures`).
      dtype: parameter and compute dtype (float32 or bfloat16).
      remat: rematerialize each layer in the backward pass.
      attention: the attention implementation, "auto" (the platform's) or a name of `jaxgrpo.models.attention`.

    A directory without tokenizer files loads with tokenizer None. Of an image-text Gemma 3 directory the
    text decoder is loaded.
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
        config, image_text = _read_hf_config(path)
        tensors = read_safetensors(path)
        if image_text:
            tensors = language_model_tensors(tensors)
    else:
        raise WeightFileError(f"{path} does not exist (expected a model directory, a .gguf file or a registered name)")
    model = decoder_from_params(config, decoder_params(tensors, config, path), dtype=dtype, remat=remat,
                                attention=attention)
    tokenizer = tokenizer_from_gguf_metadata(metadata, path) if path.endswith(".gguf") else load_tokenizer(path)
    return model, tokenizer
