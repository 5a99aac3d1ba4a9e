"""Published model architectures by name: real sizes without weights.

Each entry holds the architecture keys of the model's Hugging Face `config.json` (the repository id is
beside it), parsed by `from_hf_config` like any checkpoint. `models.load_config(name)` returns the
architecture at once, which is all that ahead-of-time compilation (`jaxgrpo-compile`) needs.

`models.load(name)` reads real weights from a local directory and never downloads: the directory is
`$JAXGRPO_MODELS/<name>` (`JAXGRPO_MODELS` defaults to `~/.cache/jaxgrpo/models`). Put the Hugging Face
repository there once, e.g.::

    huggingface-cli download Qwen/Qwen3-0.6B --local-dir ~/.cache/jaxgrpo/models/qwen3-0.6b

Its `config.json` must describe the same architecture as the entry here; a missing directory or a
different architecture is a one-line error naming the fix. A directory path passed to `load` works as
before, whatever its name.

Gemma 3 4B and 12B are published as image-text models (`model_type: gemma3`) whose `text_config` lists
only what differs from transformers' `Gemma3TextConfig` defaults; the entries here are the text
decoder's config with those defaults written out (vocabulary 262208, 8 query and 4 key-value heads for
4B, head_dim 256, `query_pre_attn_scalar` 256, RoPE bases 1e6 global and 1e4 local, a global layer every
6th, 131072 positions). Loading such a directory keeps the text decoder's weights and leaves the vision
tower unread.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, NamedTuple

from jaxgrpo.models.config import DecoderConfig, from_hf_config


class Architecture(NamedTuple):
    """A published model: its Hugging Face repository id and its `config.json` architecture keys."""

    repo_id: str
    hf_config: Mapping[str, Any]


def _qwen3(hidden, intermediate, layers, heads, tied) -> dict[str, Any]:
    """Qwen3 dense: head_dim 128, 8 key-value heads, RoPE base 1e6, 40960 positions, vocabulary 151936."""
    return {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
        "attention_bias": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": None,
        "max_position_embeddings": 40960, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": tied,
    }


def _llama3(hidden, intermediate, layers, heads, head_dim, rope_factor, tied) -> dict[str, Any]:
    """Llama 3.1/3.2: 8 key-value heads, RoPE base 5e5 with `llama3` scaling, 131072 positions."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 8, "head_dim": head_dim, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": rope_factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "max_position_embeddings": 131072, "tie_word_embeddings": tied,
    }


#: transformers' `Gemma3TextConfig` defaults for the keys `from_hf_config` reads: what the `text_config` of the
#: image-text Gemma 3 checkpoints leaves out.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "gemma3_text", "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "rms_norm_eps": 1e-06,
    "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
    "sliding_window": 4096, "sliding_window_pattern": 6, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "max_position_embeddings": 131072, "tie_word_embeddings": True,
}


def text_decoder_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text decoder's part of a `config.json`: for image-text Gemma 3 (`model_type: gemma3`), its
    `text_config` over `GEMMA3_TEXT_DEFAULTS`; any other config as it is."""
    if config.get("model_type") == "gemma3" and "text_config" in config:
        return {**GEMMA3_TEXT_DEFAULTS, **config["text_config"]}
    return config


ARCHITECTURES: dict[str, Architecture] = {
    "qwen3-0.6b": Architecture("Qwen/Qwen3-0.6B", _qwen3(1024, 3072, 28, 16, tied=True)),
    "qwen3-1.7b": Architecture("Qwen/Qwen3-1.7B", _qwen3(2048, 6144, 28, 16, tied=True)),
    "qwen3-4b": Architecture("Qwen/Qwen3-4B", _qwen3(2560, 9728, 36, 32, tied=True)),
    "qwen3-8b": Architecture("Qwen/Qwen3-8B", _qwen3(4096, 12288, 36, 32, tied=False)),
    "qwen3-14b": Architecture("Qwen/Qwen3-14B", _qwen3(5120, 17408, 40, 40, tied=False)),
    "llama3.2-1b": Architecture("meta-llama/Llama-3.2-1B", _llama3(2048, 8192, 16, 32, 64, 32.0, tied=True)),
    "llama3.2-3b": Architecture("meta-llama/Llama-3.2-3B", _llama3(3072, 8192, 28, 24, 128, 32.0, tied=True)),
    "llama3.1-8b": Architecture("meta-llama/Llama-3.1-8B", _llama3(4096, 14336, 32, 32, 128, 8.0, tied=False)),
    "gemma3-1b": Architecture("google/gemma-3-1b-pt", {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "vocab_size": 262144,
        "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False, "rms_norm_eps": 1e-06, "query_pre_attn_scalar": 256, "rope_theta": 1000000,
        "rope_local_base_freq": 10000, "rope_scaling": None, "sliding_window": 512, "sliding_window_pattern": 6,
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }),
    # The published `text_config` keys, over the defaults transformers fills in.
    "gemma3-4b": Architecture("google/gemma-3-4b-pt", text_decoder_config({"model_type": "gemma3", "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}})),
    "gemma3-12b": Architecture("google/gemma-3-12b-pt", text_decoder_config({"model_type": "gemma3", "text_config": {
        "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text", "num_attention_heads": 16,
        "num_hidden_layers": 48, "num_key_value_heads": 8, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024}})),
}


def names() -> tuple[str, ...]:
    return tuple(ARCHITECTURES)


def decoder_config(name: str) -> DecoderConfig:
    """The `DecoderConfig` of a published architecture, parsed from its `config.json` keys."""
    return from_hf_config(ARCHITECTURES[name].hf_config)


def models_dir() -> str:
    """Where `load(name)` looks for downloaded weights: $JAXGRPO_MODELS, else ~/.cache/jaxgrpo/models."""
    return os.environ.get("JAXGRPO_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "jaxgrpo", "models"))


def weights_dir(name: str) -> str:
    """The local directory holding `name`'s Hugging Face checkpoint, after checking it is there and matches.

    Raises:
      FileNotFoundError: no `config.json` in `$JAXGRPO_MODELS/<name>` (the message says how to download it).
      ValueError: the directory's `config.json` describes another architecture.
    """
    architecture = ARCHITECTURES[name]
    directory = os.path.join(models_dir(), name)
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(
            f"the weights of {name!r} are not here ({config_path} is missing): download them with "
            f"`huggingface-cli download {architecture.repo_id} --local-dir {directory}`, "
            f"or set JAXGRPO_MODELS to the folder holding {name}/")
    with open(config_path) as f:
        found = json.load(f)
    expected = decoder_config(name)
    actual = from_hf_config(text_decoder_config(found))
    if actual != expected:
        differ = [k for k in DecoderConfig.__dataclass_fields__ if getattr(actual, k) != getattr(expected, k)]
        raise ValueError(
            f"{config_path} is not {architecture.repo_id}: its {', '.join(differ)} differ from the published "
            f"architecture; put {architecture.repo_id}'s files in {directory} or load that directory by its path")
    return directory

