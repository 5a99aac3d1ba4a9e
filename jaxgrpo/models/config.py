"""Decoder configuration: one dataclass for every supported family, parsed from a Hugging Face
`config.json` (transformers 4.x and 5.x layouts) or from a GGUF file's metadata.

A family is a set of switches on the same decoder:

| family | what differs from Llama |
|---|---|
| `llama`  | nothing (SmolLM2, Llama 3 with `llama3` RoPE scaling) |
| `qwen2`  | bias on the q/k/v projections |
| `qwen3`  | RMSNorm on each query and key head before RoPE |
| `gemma3` | `(1 + w)` RMSNorm, norms after attention and MLP too, embeddings scaled by sqrt(hidden), GELU-tanh MLP, q/k norm, sliding-window layers with their own RoPE base, `query_pre_attn_scalar`, optional final-logit soft-capping |

Anything a config asks for that the decoder does not implement raises `UnsupportedConfigError`
instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple

from jaxgrpo.errors import UserError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3_text")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class UnsupportedConfigError(UserError, ValueError):
    """A checkpoint asks for something this decoder does not implement."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer type.

    `rope_type` is `default`, `linear` (all frequencies divided by `factor`) or `llama3`
    (low frequencies divided by `factor`, a smooth ramp between `low_freq_factor` and
    `high_freq_factor` wavelengths; "The Llama 3 Herd of Models", 2024).
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedConfigError(
                f"rope type {self.rope_type!r} is not implemented; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Everything the decoder needs to know about a checkpoint's architecture.

    `layer_types[i]` is `full_attention` or `sliding_attention`; sliding layers attend to the
    last `sliding_window` cache slots (the query's own slot included) and use `rope_sliding`.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    rope_sliding: RopeConfig | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    #: The context window the checkpoint was trained for (prompt + completion tokens); None if unknown.
    max_position_embeddings: int | None = None

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise UnsupportedConfigError(
                f"layer_types has {len(self.layer_types)} entries but num_layers is {self.num_layers}"
            )
        unknown = set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION}
        if unknown:
            raise UnsupportedConfigError(f"unknown layer types {sorted(unknown)}; supported: full_attention, sliding_attention")
        if SLIDING_ATTENTION in self.layer_types and not self.sliding_window:
            raise UnsupportedConfigError("sliding_attention layers need a positive sliding_window")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def is_gemma(self) -> bool:
        return self.family == "gemma3"

    @property
    def attention_scale(self) -> float:
        """Multiplier of q.k: 1/sqrt(query_pre_attn_scalar) for Gemma, 1/sqrt(head_dim) otherwise."""
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    @property
    def embedding_scale(self) -> float:
        """Gemma multiplies token embeddings by sqrt(hidden_size); the others do not."""
        return math.sqrt(self.hidden_size) if self.is_gemma else 1.0

    @property
    def sliding_layer_mask(self) -> tuple[bool, ...]:
        return tuple(t == SLIDING_ATTENTION for t in self.layer_types)


def _require(value: Any, expected: Any, field: str, model_type: str) -> None:
    if value != expected:
        raise UnsupportedConfigError(f"{model_type}: {field}={value!r} is not supported (only {expected!r})")


def _rope_from_dict(params: Mapping[str, Any] | None, default_theta: float) -> RopeConfig:
    """A `RopeConfig` from a transformers 5 `rope_parameters` entry or a 4.x `rope_scaling` dict."""
    params = dict(params or {})
    legacy_type = params.pop("type", None)  # transformers < 4.45 spelled it `type`
    rope_type = params.pop("rope_type", None) or legacy_type or "default"
    theta = params.pop("rope_theta", default_theta)
    known = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    extra = set(params) - known
    if rope_type == "default":
        extra |= set(params) & known
    if extra and rope_type in SUPPORTED_ROPE_TYPES:
        raise UnsupportedConfigError(f"rope parameters {sorted(extra)} are not supported for rope type {rope_type!r}")
    return RopeConfig(theta=float(theta), rope_type=rope_type, **{k: params[k] for k in known & set(params)})


def _rope_parameters(config: Mapping[str, Any], layer_type: str | None, default_theta: float) -> RopeConfig:
    if "rope_parameters" in config and config["rope_parameters"] is not None:
        params = config["rope_parameters"]
        if layer_type is not None and layer_type in params:
            params = params[layer_type]
        return _rope_from_dict(params, default_theta)
    # transformers 4.x layout
    theta = config.get("rope_theta", default_theta)
    if layer_type == SLIDING_ATTENTION:
        return RopeConfig(theta=float(config.get("rope_local_base_freq", 10000.0)))
    return _rope_from_dict({"rope_theta": theta, **(config.get("rope_scaling") or {})}, theta)


def from_hf_config(config: Mapping[str, Any]) -> DecoderConfig:
    """Parse a Hugging Face `config.json` dict.

    Raises:
      UnsupportedConfigError: an architecture outside `SUPPORTED_ARCHITECTURES`, or a field
        (bias, activation, RoPE variant, bidirectional attention, ...) this decoder does not implement.
    """
    model_type = config.get("model_type")
    if model_type == "gemma3" and "text_config" in config:
        raise UnsupportedConfigError(
            "model_type 'gemma3' is the multimodal Gemma 3; only its text decoder ('gemma3_text') is supported"
        )
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedConfigError(
            f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    family = "gemma3" if model_type == "gemma3_text" else model_type
    num_heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedConfigError(f"{model_type}: partial_rotary_factor={config['partial_rotary_factor']} is not supported")
    _require(config.get("mlp_bias", False), False, "mlp_bias", model_type)

    activation = config.get("hidden_activation") or config.get("hidden_act")
    expected_activation = "gelu_pytorch_tanh" if family == "gemma3" else "silu"
    _require(activation, expected_activation, "hidden activation", model_type)

    if family == "qwen2":
        qkv_bias = True
        _require(config.get("use_sliding_window", False), False, "use_sliding_window", model_type)
    else:
        _require(config.get("attention_bias", False), False, "attention_bias", model_type)
        qkv_bias = False

    layer_types = tuple(config.get("layer_types") or ())
    sliding_window = None
    rope_sliding = None
    query_pre_attn_scalar = None
    final_logit_softcapping = None
    if family == "gemma3":
        _require(config.get("attn_logit_softcapping"), None, "attn_logit_softcapping", model_type)
        _require(config.get("use_bidirectional_attention", False), False, "use_bidirectional_attention", model_type)
        if not layer_types:
            pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
            layer_types = tuple(
                FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_ATTENTION for i in range(config["num_hidden_layers"])
            )
        sliding_window = config.get("sliding_window")
        rope_sliding = _rope_parameters(config, SLIDING_ATTENTION, 10000.0)
        query_pre_attn_scalar = config.get("query_pre_attn_scalar", head_dim)
        final_logit_softcapping = config.get("final_logit_softcapping")
    elif any(t != FULL_ATTENTION for t in layer_types):
        raise UnsupportedConfigError(f"{model_type}: layer_types {set(layer_types)} are not supported (only full_attention)")

    return DecoderConfig(
        family=family,
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope=_rope_parameters(config, FULL_ATTENTION, 10000.0 if family != "gemma3" else 1e6),
        rope_sliding=rope_sliding,
        layer_types=layer_types,
        sliding_window=sliding_window,
        tie_word_embeddings=config.get("tie_word_embeddings", family == "gemma3"),
        qkv_bias=qkv_bias,
        qk_norm=family in ("qwen3", "gemma3"),
        query_pre_attn_scalar=query_pre_attn_scalar,
        final_logit_softcapping=final_logit_softcapping,
        max_position_embeddings=config.get("max_position_embeddings"),
    )


def from_gguf_metadata(metadata: Mapping[str, Any], vocab_size: int, tie_word_embeddings: bool) -> DecoderConfig:
    """Parse GGUF metadata (`{arch}.block_count`, ...) into the equivalent Hugging Face config.

    Gemma 3 files omit what its Hugging Face config defaults provide: a global layer every 6th
    layer, local RoPE base 10000, `query_pre_attn_scalar = head_dim`, no soft-capping.
    """
    arch = metadata["general.architecture"]
    gguf_families = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
    if arch not in gguf_families:
        raise UnsupportedConfigError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(gguf_families)}"
        )

    def get(key, default=None):
        return metadata.get(f"{arch}.{key}", default)

    hidden = get("embedding_length")
    num_heads = get("attention.head_count")
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // num_heads
    if get("attention.value_length", head_dim) != head_dim:
        raise UnsupportedConfigError(f"{arch}: attention.value_length differs from key_length, not supported")
    config: dict[str, Any] = {
        "model_type": gguf_families[arch],
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": get("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "tie_word_embeddings": tie_word_embeddings,
        "hidden_act": "gelu_pytorch_tanh" if arch == "gemma3" else "silu",
        "max_position_embeddings": get("context_length"),
    }
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise UnsupportedConfigError(f"{arch}: rope.scaling.type={scaling!r} is not implemented; supported: linear")
    if arch == "gemma3":
        config["sliding_window"] = get("attention.sliding_window")
        config["final_logit_softcapping"] = get("final_logit_softcapping")
        config["attn_logit_softcapping"] = get("attn_logit_softcapping")
    return from_hf_config(config)


class Projection(NamedTuple):
    """A projection weight of a block: the module holding it, its logical axes after the layer axis, and how many
    of its leading axes its product contracts (the rest are the output's)."""

    module: str
    axes: tuple[str, ...]
    contracted: int


#: The projection weights of every block (`Block.attn` and `Block.mlp`), by name: the matrices the layers multiply
#: activations by, and so what LoRA adapts (`jaxgrpo.models.lora`) and the CPU decode packs (`cpu_forms`).
PROJECTIONS: dict[str, Projection] = {
    "q": Projection("attn", ("embed", "heads", "head_dim"), 1),
    "k": Projection("attn", ("embed", "kv_heads", "head_dim"), 1),
    "v": Projection("attn", ("embed", "kv_heads", "head_dim"), 1),
    "o": Projection("attn", ("heads", "head_dim", "embed"), 2),
    "gate": Projection("mlp", ("embed", "mlp"), 1),
    "up": Projection("mlp", ("embed", "mlp"), 1),
    "down": Projection("mlp", ("mlp", "embed"), 1),
}
