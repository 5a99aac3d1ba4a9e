"""Shared-prefix forward ("Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward", 2025).

GRPO scores G completions of each prompt. Run naively, the prompt goes through the network G
times. Here the prompt is run once, its keys and values kept in a KV cache, and the G completions
attend to that one copy (the decoder's `prefix=`, each prompt's keys read once for its G rows): outputs and gradients equal the replicated batch (causal attention never lets
a prompt token see a completion), while the prompt's projections and MLPs cost 1/G.

Shapes: N prompts of (left-padded) length P, each with G completions of length S.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgrpo.models.decoder import Decoder, positions_from_mask
from jaxgrpo.models.logprobs import token_logprobs_and_entropy


def shared_prefix_hidden_states(
    model: Decoder, prompt_tokens: jax.Array, prompt_mask: jax.Array, completion_tokens: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Final hidden states of prompts computed once and of their completions.

    Args:
      prompt_tokens: int [N, P], left-padded.
      prompt_mask: bool [N, P], True on real prompt tokens.
      completion_tokens: int [N, G, S] (right padding after EOS is harmless: it is causal-later).

    Returns:
      (prompt_hidden [N, P, E], completion_hidden [N, G, S, E]), equal to the hidden states of the
      replicated batch `concat(prompt_tokens[n], completion_tokens[n, g])` with the prompt's padding masked.
    """
    num_prompts, prompt_length = prompt_tokens.shape
    _, group_size, completion_length = completion_tokens.shape
    prompt_mask = prompt_mask.astype(bool)
    positions = positions_from_mask(prompt_mask, None, prompt_length)
    prompt_hidden, prompt_cache = model.decode_step(
        prompt_tokens, positions, cache=model.init_cache(num_prompts, prompt_length), cache_index=0, kv_mask=prompt_mask
    )

    # The G completions of prompt n read prompt n's keys and values from one copy (the decoder's prefix).
    rows = num_prompts * group_size
    prompt_lengths = jnp.repeat(prompt_mask.sum(axis=1), group_size)
    completion_positions = prompt_lengths[:, None] + jnp.arange(completion_length)[None]
    completion_hidden, _ = model.decode_step(
        completion_tokens.reshape(rows, completion_length),
        completion_positions,
        cache=model.init_cache(rows, completion_length),
        cache_index=0,
        kv_mask=jnp.ones((rows, completion_length), bool),
        prefix=prompt_cache,
        prefix_mask=prompt_mask,
    )
    return prompt_hidden, completion_hidden.reshape(num_prompts, group_size, completion_length, -1)


def shared_prefix_logits(model: Decoder, prompt_tokens, prompt_mask, completion_tokens) -> tuple[jax.Array, jax.Array]:
    """(prompt_logits [N, P, V], completion_logits [N, G, S, V]) via `shared_prefix_hidden_states`."""
    prompt_hidden, completion_hidden = shared_prefix_hidden_states(model, prompt_tokens, prompt_mask, completion_tokens)
    return model.logits_from_hidden(prompt_hidden), model.logits_from_hidden(completion_hidden)


def shared_prefix_token_logprobs(
    model: Decoder,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    completion_tokens: jax.Array,
    *,
    temperature: float = 1.0,
    sequence_chunk: int | None = None,
    vocab_chunk: int = 8192,
) -> tuple[jax.Array, jax.Array]:
    """Log-probabilities and entropies [N, G, S] of each completion token given prompt and earlier tokens.

    Token s of a completion is predicted from the last prompt token (s = 0) or completion token s - 1.
    """
    num_prompts, group_size, completion_length = completion_tokens.shape
    prompt_hidden, completion_hidden = shared_prefix_hidden_states(model, prompt_tokens, prompt_mask, completion_tokens)
    last_prompt = jnp.broadcast_to(prompt_hidden[:, None, -1:], (num_prompts, group_size, 1, prompt_hidden.shape[-1]))
    predicting = jnp.concatenate([last_prompt, completion_hidden[:, :, :-1]], axis=2)
    log_probs, entropy = token_logprobs_and_entropy(
        predicting.reshape(num_prompts * group_size, completion_length, -1),
        model.unembedding(),
        completion_tokens.reshape(num_prompts * group_size, completion_length),
        temperature=temperature,
        logit_softcap=model.config.final_logit_softcapping,
        sequence_chunk=sequence_chunk,
        vocab_chunk=vocab_chunk,
    )
    shape = (num_prompts, group_size, completion_length)
    return log_probs.reshape(shape), entropy.reshape(shape)
