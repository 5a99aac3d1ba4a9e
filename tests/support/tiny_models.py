"""Tiny decoder configs shared by model tests: two layers, small enough to compile in seconds."""

from jaxgrpo.models import DecoderConfig


def llama_and_gemma3(sliding_window: int) -> dict[str, DecoderConfig]:
    """A Llama (grouped-query attention) and a Gemma 3 (a sliding layer of `sliding_window`, then a full
    one; q/k norms, soft-capped logits, tied embeddings), both over a 61-token vocabulary."""
    return {
        "llama": DecoderConfig(family="llama", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                               num_heads=4, num_kv_heads=2, head_dim=8),
        "gemma3": DecoderConfig(family="gemma3", vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                                num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, sliding_window=sliding_window,
                                layer_types=("sliding_attention", "full_attention"), final_logit_softcapping=4.0,
                                tie_word_embeddings=True),
    }


def write_hf_checkpoint(directory, config: dict, *, prefix: str = "model.", drop=(), extra=None, seed: int = 0) -> dict:
    """Write a Hugging Face model directory (config.json + model.safetensors, random float32 weights) for a
    Llama, Qwen3 or Gemma 3 text `config`; returns the tensors by name. `prefix` replaces "model." (an
    image-text Gemma 3 saves its text decoder under "language_model.model."), `drop` leaves tensors out and
    `extra` adds some (a vision tower)."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    text = config.get("text_config", config)
    e, f, v, layers = text["hidden_size"], text["intermediate_size"], text["vocab_size"], text["num_hidden_layers"]
    nq = text["num_attention_heads"]
    nk = text.get("num_key_value_heads", nq)
    d = text.get("head_dim") or e // nq
    gemma = text.get("model_type") == "gemma3_text"
    shapes = {"embed_tokens.weight": (v, e), "norm.weight": (e,)}
    for i in range(layers):
        layer = {"self_attn.q_proj.weight": (nq * d, e), "self_attn.k_proj.weight": (nk * d, e),
                 "self_attn.v_proj.weight": (nk * d, e), "self_attn.o_proj.weight": (e, nq * d),
                 "mlp.gate_proj.weight": (f, e), "mlp.up_proj.weight": (f, e), "mlp.down_proj.weight": (e, f),
                 "input_layernorm.weight": (e,), "post_attention_layernorm.weight": (e,)}
        if gemma or text.get("model_type") == "qwen3":
            layer |= {"self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,)}
        if gemma:
            layer |= {"pre_feedforward_layernorm.weight": (e,), "post_feedforward_layernorm.weight": (e,)}
        shapes |= {f"layers.{i}.{name}": shape for name, shape in layer.items()}
    rng = np.random.default_rng(seed)
    tensors = {prefix + name: rng.normal(0, 0.02, shape).astype(np.float32) for name, shape in shapes.items()}
    if not text.get("tie_word_embeddings", gemma):
        tensors["lm_head.weight"] = rng.normal(0, 0.02, (v, e)).astype(np.float32)
    tensors = {k: t for k, t in tensors.items() if k not in drop} | dict(extra or {})
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return tensors


class TwoTurns:
    """An environment of two turns: a user message answers the first; the second ends the episode, rewarded 1
    when the policy's text has an even length (so a group's episodes differ)."""

    failure_reward = 0.0

    def reset(self, example):
        return [{"role": "user", "content": f"What is {example['question']}?"}]

    def step(self, action):
        from jaxgrpo.envs import Step

        if not hasattr(self, "heard"):
            self.heard = True
            return Step([{"role": "user", "content": "Say it again."}], 0.0, False, {})
        return Step(None, float(len(action) % 2 == 0), True, {})


def register_two_turn_episodes() -> None:
    """Registers (once) the model `random-smollm2-vocab`, a tiny random Llama over SmolLM2's tokenizer (the
    chat template environments need), and the environment `two_turns` (`TwoTurns`)."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxgrpo.envs import environment_names, register_environment
    from jaxgrpo.models import Decoder, registry
    from jaxgrpo.models.tokenizer import load_tokenizer
    from jaxgrpo.train import register_model_builder, state

    if "random-smollm2-vocab" not in state.MODEL_BUILDERS:
        tokenizer = load_tokenizer(registry.smollm2_135m_instruct())

        def build(dtype=jnp.float32, remat=True):
            config = DecoderConfig(family="llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
            return Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)), tokenizer

        register_model_builder("random-smollm2-vocab", build)
    if "two_turns" not in environment_names():
        register_environment("two_turns", TwoTurns)
