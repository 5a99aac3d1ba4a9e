"""Exporting a policy as a Hugging Face model directory that `transformers` loads as it is.

The directory holds `config.json` (the family's transformers config), `model.safetensors` (float32,
Hugging Face tensor names and [out, in] layouts), `generation_config.json` (the stop tokens) and the
tokenizer's files with its chat template. `AutoModelForCausalLM.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)` then give the same logits as the jaxgrpo decoder (checked to 1e-4
per family in tests/tools/test_export.py).

A LoRA run (`Config.lora`) exports three ways: merged (the default: each adapted projection written as
W + (alpha / r) A B, W dequantized under QLoRA, so transformers needs nothing more), its adapters alone in PEFT's
format (`export_adapters`: `adapter_config.json` + `adapter_model.safetensors`, which `peft` loads onto the base,
checked to 1e-4 in tests/models/test_lora.py), or the base the adapters apply to (`adapters=False`, for a base with no
Hugging Face original, e.g. the main job's GGUF).

The mapping is the inverse of `jaxgrpo.models.weights.decoder_params`. What needs no conversion, and why:
the decoder stores Gemma's RMSNorm weights as transformers does (the forward pass adds 1), scales
Gemma's embeddings in the forward pass as transformers' `Gemma3TextScaledWordEmbedding` does, and a
tied model has no `lm_head` (transformers ties it to the embedding from `tie_word_embeddings`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from jaxgrpo.errors import UserError
from jaxgrpo.models.config import DecoderConfig, RopeConfig

#: jaxgrpo family -> (transformers model_type, architecture class).
HF_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}

# transformers needs a context length; a config that does not know its own (a model built in code) gets this.
DEFAULT_MAX_POSITIONS = 4096


class ExportError(UserError, ValueError):
    """A model cannot be exported; the message (one line) names the problem and what to do."""


def _rope_parameters(rope: RopeConfig) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type in ("linear", "llama3"):
        params["factor"] = rope.factor
    if rope.rope_type == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                      original_max_position_embeddings=rope.original_max_position_embeddings)
    return params


def check_exportable(config: DecoderConfig) -> None:
    if config.family not in HF_ARCHITECTURES:
        raise ExportError(f"family {config.family!r} has no Hugging Face mapping; exportable families: "
                          f"{', '.join(HF_ARCHITECTURES)}")


def hf_config(config: DecoderConfig, *, bos_token_id: int | None = None, eos_token_id=None,
              pad_token_id: int | None = None) -> dict[str, Any]:
    """The transformers `config.json` (5.x layout: `rope_parameters`) of a decoder config."""
    check_exportable(config)
    c = config
    model_type, architecture = HF_ARCHITECTURES[c.family]
    out: dict[str, Any] = {
        "model_type": model_type, "architectures": [architecture], "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings or DEFAULT_MAX_POSITIONS,
        "tie_word_embeddings": c.tie_word_embeddings, "dtype": "float32", "attention_dropout": 0.0,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id,
    }
    if c.is_gemma:
        out.update(
            hidden_activation="gelu_pytorch_tanh", attention_bias=False,
            query_pre_attn_scalar=c.query_pre_attn_scalar or c.head_dim, sliding_window=c.sliding_window,
            layer_types=list(c.layer_types), final_logit_softcapping=c.final_logit_softcapping,
            attn_logit_softcapping=None, use_bidirectional_attention=False,
            rope_parameters={"full_attention": _rope_parameters(c.rope),
                             "sliding_attention": _rope_parameters(c.rope_sliding or RopeConfig(theta=10000.0))},
        )
    else:
        out.update(hidden_act="silu", rope_parameters=_rope_parameters(c.rope), layer_types=list(c.layer_types))
        if c.family == "llama":
            out.update(attention_bias=False, mlp_bias=False)
        elif c.family == "qwen2":  # the q/k/v biases are part of transformers' Qwen2, not a config switch
            out.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.num_layers)
        else:
            out.update(attention_bias=False, use_sliding_window=False, sliding_window=None,
                       max_window_layers=c.num_layers)
    return out


def hf_tensors(params: Mapping[str, Any], config: DecoderConfig) -> dict[str, np.ndarray]:
    """Hugging Face-named float32 tensors of the decoder's parameter tree (the inverse of `decoder_params`)."""
    check_exportable(config)
    c = config
    e, nq, nk, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim

    def array(x) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x, np.float32))

    layers, attn = params["layers"], params["layers"]["attn"]
    per_layer: dict[str, tuple[np.ndarray, Any]] = {
        "self_attn.q_proj.weight": (attn["q"], lambda w: w.transpose(1, 2, 0).reshape(nq * d, e)),
        "self_attn.k_proj.weight": (attn["k"], lambda w: w.transpose(1, 2, 0).reshape(nk * d, e)),
        "self_attn.v_proj.weight": (attn["v"], lambda w: w.transpose(1, 2, 0).reshape(nk * d, e)),
        "self_attn.o_proj.weight": (attn["o"], lambda w: w.transpose(2, 0, 1).reshape(e, nq * d)),
        "mlp.gate_proj.weight": (layers["mlp"]["gate"], np.transpose),
        "mlp.up_proj.weight": (layers["mlp"]["up"], np.transpose),
        "mlp.down_proj.weight": (layers["mlp"]["down"], np.transpose),
        "input_layernorm.weight": (layers["attn_norm"]["weight"], None),
    }
    if c.qkv_bias:
        for name in ("q", "k", "v"):
            per_layer[f"self_attn.{name}_proj.bias"] = (attn[f"{name}_bias"], lambda b: b.reshape(-1))
    if c.qk_norm:
        per_layer["self_attn.q_norm.weight"] = (attn["q_norm"]["weight"], None)
        per_layer["self_attn.k_norm.weight"] = (attn["k_norm"]["weight"], None)
    if c.is_gemma:
        per_layer["pre_feedforward_layernorm.weight"] = (layers["mlp_norm"]["weight"], None)
        per_layer["post_attention_layernorm.weight"] = (layers["attn_out_norm"]["weight"], None)
        per_layer["post_feedforward_layernorm.weight"] = (layers["mlp_out_norm"]["weight"], None)
    else:
        per_layer["post_attention_layernorm.weight"] = (layers["mlp_norm"]["weight"], None)

    tensors = {"model.embed_tokens.weight": array(params["embed"]),
               "model.norm.weight": array(params["final_norm"]["weight"])}
    for suffix, (stacked, transform) in per_layer.items():
        stacked = np.asarray(stacked, np.float32)
        for i in range(c.num_layers):
            tensors[f"model.layers.{i}.{suffix}"] = array(stacked[i] if transform is None else transform(stacked[i]))
    if not c.tie_word_embeddings:
        tensors["lm_head.weight"] = array(np.asarray(params["lm_head"]).T)
    return tensors


def decoder_params_of(model, *, adapters: bool = True) -> dict[str, Any]:
    """The decoder's parameters as a nested dict of numpy arrays (the tree `decoder_params` builds). A LoRA-adapted
    decoder's projections are merged with their adapters (`lora.merged_params`), or with `adapters=False` are
    its base's (dequantized under QLoRA)."""
    from jaxgrpo.models import lora

    return lora.merged_params(model, adapters=adapters)


#: The decoder's projections by their Hugging Face module names under `model.layers.{i}.`.
HF_PROJECTIONS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                  "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def peft_tensors(adapters: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """PEFT's LoRA tensors of stacked adapters {target: (A [layers, *in, r], B [layers, r, *out])}: per layer
    `...lora_A.weight` [r, in] and `...lora_B.weight` [out, r], a projection's in and out axes flattened in the
    order of its Hugging Face weight (heads-major, as `hf_tensors` writes q, k, v and o)."""
    tensors = {}
    for name, (a, b) in adapters.items():
        rank = a.shape[-1]
        for i in range(a.shape[0]):
            prefix = f"base_model.model.model.layers.{i}.{HF_PROJECTIONS[name]}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, rank).T, np.float32)
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].reshape(rank, -1).T, np.float32)
    return tensors


def peft_config(settings, base_model: str) -> dict[str, Any]:
    """PEFT's `adapter_config.json` for adapters of `settings` (`lora.LoraSettings`) on `base_model`: its scale
    lora_alpha / r is qwix's alpha / rank."""
    alpha = settings.alpha
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": settings.rank, "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
            "target_modules": sorted(HF_PROJECTIONS[t].split(".")[-1] for t in settings.targets),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None, "layers_to_transform": None}


def export_adapters(model, out_dir: str, *, base_model: str, overwrite: bool = False) -> str:
    """Writes the adapters of `model` (a LoRA-adapted `Decoder`) to `out_dir` in PEFT's format, for `peft` to load
    onto `base_model` (written into the config as `base_model_name_or_path`). A non-empty `out_dir` is refused
    unless `overwrite`."""
    from safetensors.numpy import save_file

    from jaxgrpo.models import lora

    settings = lora.settings(model)
    if settings is None:
        raise ExportError("the model has no LoRA adapters to export; export it whole (without --peft)")
    check_exportable(model.config)
    check_out_dir(out_dir, overwrite=overwrite)
    os.makedirs(out_dir, exist_ok=True)
    save_file(peft_tensors(lora.adapters_of(model)), os.path.join(out_dir, "adapter_model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(peft_config(settings, base_model), f, indent=2)
    return out_dir


def hf_tokenizer(tokenizer):
    """A transformers tokenizer for `tokenizer`: itself if it is one, else its `to_hf_tokenizer()`."""
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    if hasattr(tokenizer, "to_hf_tokenizer"):
        return tokenizer.to_hf_tokenizer()
    raise ExportError(f"tokenizer {type(tokenizer).__name__} is neither a transformers tokenizer nor has "
                      "to_hf_tokenizer(); give it one that builds a PreTrainedTokenizerFast")


def check_out_dir(out_dir: str, *, overwrite: bool = False) -> None:
    """Raises `ExportError` unless `out_dir` is absent, empty, or `overwrite` is given: an export never replaces
    another export's (or anyone's) files unasked. With `overwrite` the files an export writes are replaced and
    everything else in `out_dir` is left as it is."""
    if not os.path.exists(out_dir):
        return
    if not os.path.isdir(out_dir):
        raise ExportError(f"--out {out_dir} is a file, not a directory; choose another --out")
    entries = sorted(os.listdir(out_dir))
    if entries and not overwrite:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ExportError(f"--out {out_dir} is not empty (it holds {shown}); pass --overwrite to replace the files an "
                          "export writes there (the others are kept), or choose another --out")


def export_model(model, tokenizer, out_dir: str, *, overwrite: bool = False, adapters: bool = True) -> str:
    """Writes `model` (a jaxgrpo `Decoder`) and `tokenizer` to `out_dir` as a Hugging Face model directory.

    A LoRA-adapted model is written merged, or with `adapters=False` as its base. A non-empty `out_dir` is refused
    unless `overwrite` (`check_out_dir`)."""
    from safetensors.numpy import save_file

    from jaxgrpo import sampler

    config = model.config
    check_exportable(config)
    check_out_dir(out_dir, overwrite=overwrite)
    if tokenizer is None:
        raise ExportError("the model has no tokenizer; a Hugging Face directory without one cannot render prompts")
    hf_tok = hf_tokenizer(tokenizer)
    stop = sampler.default_stop_tokens(tokenizer)
    eos = stop[0] if len(stop) == 1 else (stop or None)
    bos = getattr(tokenizer, "bos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    tensors = hf_tensors(decoder_params_of(model, adapters=adapters), config)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(config, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}, f, indent=2)
    hf_tok.save_pretrained(out_dir)
    return out_dir


#: What `export_run` writes: the policy (merged with its adapters under LoRA), a LoRA run's adapters alone in
#: PEFT's format, or a LoRA run's base.
FORMS = ("model", "peft", "base")


def base_model_name(source: str) -> str:
    """What PEFT's `base_model_name_or_path` names for a run's model: a published architecture's Hugging Face
    repository (its weights are that repository's), else the model as the run names it."""
    from jaxgrpo.models import architectures

    found = architectures.ARCHITECTURES.get(source)
    return found.repo_id if found is not None else source


def export_run(run_dir: str, out_dir: str, *, step: int | None = None, overwrite: bool = False,
               form: str = "model") -> tuple[str, int]:
    """Exports `run_dir`'s checkpoint of `step` (default: the newest) as `form` (`FORMS`); returns (out_dir, step).

    A non-empty `out_dir` is refused unless `overwrite`, and `peft` / `base` for a run without LoRA, before anything
    is built (`check_out_dir`)."""
    from jaxgrpo.evaluation import runs
    from jaxgrpo.models import load_config
    from jaxgrpo.train.state import MODEL_BUILDERS

    if form not in FORMS:
        raise ExportError(f"unknown export form {form!r}; valid: {', '.join(FORMS)}")
    cfg = runs.read_config(run_dir)
    if form != "model" and cfg.lora is None:
        raise ExportError(f"run {run_dir} trained every parameter (its config has no lora): it has no adapters and "
                          f"no separate base; export it without --{form}")
    step = runs.choose_step(run_dir, step)
    check_out_dir(out_dir, overwrite=overwrite)
    if cfg.model not in MODEL_BUILDERS:  # a checkpoint's architecture is known before anything is built
        check_exportable(load_config(cfg.model))
    # A PPO value head is the critic of training, not part of the policy: only the decoder is written.
    trainer, _ = runs.build_trainer(cfg, run_dir, step)
    if form == "peft":
        export_adapters(trainer.policy.decoder, out_dir, base_model=base_model_name(cfg.model), overwrite=overwrite)
    else:
        export_model(trainer.policy.decoder, trainer.tokenizer, out_dir, overwrite=overwrite,
                     adapters=form == "model")
    return out_dir, step
