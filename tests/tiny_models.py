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
