"""Reading checkpoints into the decoder's parameter tree, with numpy only (no torch).

Both formats are first read into a flat `{hugging_face_name: np.ndarray}` dict in Hugging Face's
layout (`model.layers.3.self_attn.q_proj.weight`, weights as [out, in]); `decoder_params` then
stacks the layers and transposes to the decoder's [in, out] / per-head layout.

* safetensors: `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
* GGUF: read by `gguf_file`, tensors dequantized to float32 by gguf-py. llama.cpp stores Llama's q/k projection
  rows permuted for its interleaved RoPE and Gemma's norm weights as `1 + w`; both are undone here.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from jaxgrpo.errors import UserError
from jaxgrpo.models import gguf_file
from jaxgrpo.models.config import DecoderConfig


class WeightFileError(UserError, OSError):
    """A weight file is missing, unreadable or lacks a tensor the architecture needs."""


def read_safetensors(directory: str) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face model directory, as numpy arrays keyed by name."""
    from safetensors import safe_open

    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise WeightFileError(f"weight file {path} is missing (expected model.safetensors or the shards of its index)")
        try:
            with safe_open(path, framework="numpy") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except Exception as error:  # safetensors raises its own error types for corrupt headers or data
            raise WeightFileError(f"cannot read weight file {path}: {error}") from error
    return tensors


# GGUF tensor names (per block: `blk.{i}.<name>`) -> Hugging Face suffixes under `model.layers.{i}.`.
_GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _unpermute_llama_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head row permutation of q/k (interleaved -> rotate-half RoPE layout)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def open_gguf(path: str) -> tuple[dict[str, Any], list[gguf_file.Tensor]]:
    """`gguf_file.read(path)`, a missing or unreadable file a `WeightFileError` naming it."""
    if not os.path.exists(path):
        raise WeightFileError(f"GGUF file {path} does not exist")
    try:
        return gguf_file.read(path)
    except Exception as error:
        raise WeightFileError(f"cannot read GGUF file {path}: {error}") from error


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, tensors) of a GGUF file; tensors dequantized to float32 under Hugging Face names. The metadata
    holds every key, the tokenizer's too (`tokenizer.*`): one read of the file serves the model and its tokenizer."""
    from gguf import dequantize

    metadata, gguf_tensors = open_gguf(path)
    arch = metadata.get("general.architecture")
    ffn_norm = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"

    tensors: dict[str, np.ndarray] = {}
    for tensor in gguf_tensors:
        stem, kind = tensor.name.rsplit(".", 1)
        if stem.startswith("blk."):
            _, layer, short = stem.split(".", 2)
            suffix = ffn_norm if short == "ffn_norm" else _GGUF_BLOCK_NAMES.get(short)
            name = None if suffix is None else f"model.layers.{layer}.{suffix}.{kind}"
        else:
            short = stem
            name = None if stem not in _GGUF_GLOBAL_NAMES else f"{_GGUF_GLOBAL_NAMES[stem]}.{kind}"
        if name is None:
            raise WeightFileError(f"{path}: tensor {tensor.name!r} has no counterpart in the decoder")
        try:
            value = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        except Exception as error:
            raise WeightFileError(f"{path}: cannot dequantize tensor {tensor.name!r}: {error}") from error
        if arch == "llama" and short in ("attn_q", "attn_k") and kind == "weight":
            heads = metadata["llama.attention.head_count" if short == "attn_q" else "llama.attention.head_count_kv"]
            value = _unpermute_llama_rows(value, heads)
        if arch == "gemma3" and short.endswith("norm"):
            value = value - 1.0
        tensors[name] = value
    return metadata, tensors


def language_model_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The text decoder's tensors of an image-text Gemma 3 checkpoint, under the text-only names.

    transformers 4.x saves them as `language_model.model.*` (and `language_model.lm_head.*`), 5.x as
    `model.language_model.*`; the vision tower and the projector are left out.
    """
    prefixes = {"language_model.model.": "model.", "model.language_model.": "model.",
                "language_model.lm_head.": "lm_head."}
    renamed = {}
    for name, value in tensors.items():
        for prefix, replacement in prefixes.items():
            if name.startswith(prefix):
                renamed[replacement + name[len(prefix):]] = value
    return renamed


def decoder_params(tensors: Mapping[str, np.ndarray], config: DecoderConfig, source: str) -> dict[str, Any]:
    """The decoder's parameter tree (nested dict of numpy arrays) from Hugging Face-named tensors.

    Raises:
      WeightFileError: a tensor the architecture needs is absent, or has the wrong shape.
    """
    c = config

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise WeightFileError(f"{source}: tensor {name!r} is missing")
        value = tensors[name]
        if value.shape != shape:
            raise WeightFileError(f"{source}: tensor {name!r} has shape {value.shape}, expected {shape}")
        return value

    e, f, d, nq, nk = c.hidden_size, c.intermediate_size, c.head_dim, c.num_heads, c.num_kv_heads

    def stacked(suffix: str, shape: tuple[int, ...], transform=lambda w: w) -> np.ndarray:
        return np.stack([transform(get(f"model.layers.{i}.{suffix}", shape)) for i in range(c.num_layers)])

    def projection_in(heads):  # [heads * d, e] -> [e, heads, d]
        return lambda w: w.reshape(heads, d, e).transpose(2, 0, 1)

    def bias(heads):
        return lambda b: b.reshape(heads, d)

    attn: dict[str, Any] = {
        "q": stacked("self_attn.q_proj.weight", (nq * d, e), projection_in(nq)),
        "k": stacked("self_attn.k_proj.weight", (nk * d, e), projection_in(nk)),
        "v": stacked("self_attn.v_proj.weight", (nk * d, e), projection_in(nk)),
        "o": stacked("self_attn.o_proj.weight", (e, nq * d), lambda w: w.reshape(e, nq, d).transpose(1, 2, 0)),
    }
    if c.qkv_bias:
        attn["q_bias"] = stacked("self_attn.q_proj.bias", (nq * d,), bias(nq))
        attn["k_bias"] = stacked("self_attn.k_proj.bias", (nk * d,), bias(nk))
        attn["v_bias"] = stacked("self_attn.v_proj.bias", (nk * d,), bias(nk))
    if c.qk_norm:
        attn["q_norm"] = {"weight": stacked("self_attn.q_norm.weight", (d,))}
        attn["k_norm"] = {"weight": stacked("self_attn.k_norm.weight", (d,))}
    layers: dict[str, Any] = {
        "attn": attn,
        "attn_norm": {"weight": stacked("input_layernorm.weight", (e,))},
        "mlp": {
            "gate": stacked("mlp.gate_proj.weight", (f, e), np.transpose),
            "up": stacked("mlp.up_proj.weight", (f, e), np.transpose),
            "down": stacked("mlp.down_proj.weight", (e, f), np.transpose),
        },
    }
    if c.is_gemma:
        layers["mlp_norm"] = {"weight": stacked("pre_feedforward_layernorm.weight", (e,))}
        layers["attn_out_norm"] = {"weight": stacked("post_attention_layernorm.weight", (e,))}
        layers["mlp_out_norm"] = {"weight": stacked("post_feedforward_layernorm.weight", (e,))}
    else:
        layers["mlp_norm"] = {"weight": stacked("post_attention_layernorm.weight", (e,))}
    params: dict[str, Any] = {
        "embed": get("model.embed_tokens.weight", (c.vocab_size, e)),
        "layers": layers,
        "final_norm": {"weight": get("model.norm.weight", (e,))},
    }
    if not c.tie_word_embeddings:
        params["lm_head"] = get("lm_head.weight", (c.vocab_size, e)).T
    return params
