"""Per-token log-probabilities and entropies from hidden states, without materializing [B, T, V] logits.

For final hidden states h [B, T, E] and the output projection W [E, V], the logits of token t are
z = softcap(h_t W) / temperature, and

    log p(y_t) = z[y_t] - logsumexp(z),        entropy_t = logsumexp(z) - sum_v softmax(z)_v z_v.

`token_logprobs_and_entropy` walks the sequence in chunks (`lax.map`) and, inside each, the vocabulary
in chunks (`lax.scan`) with an online logsumexp ("Online normalizer calculation for softmax",
Milakov & Gimelshein 2018), so the largest logits block alive is [B, sequence_chunk, vocab_chunk].
Each sequence chunk is rematerialized in the backward pass, which keeps gradients equally small.
Temperature divides the (soft-capped) logits, exactly as the sampler does.
"""

from __future__ import annotations

import numbers

import chex
import jax
import jax.numpy as jnp

# Logit of vocabulary padding columns; finite so that 0 * logit stays 0 in values and gradients.
_PADDING_LOGIT = -1e30


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
    """Gemma's logit soft-capping `cap * tanh(logits / cap)`; identity when cap is None."""
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def _softcapped_scaled(logits: jax.Array, temperature: float, logit_softcap: float | None) -> jax.Array:
    return soft_cap(logits, logit_softcap) / temperature


def _check_temperature(temperature: float) -> None:
    # The sampler reads temperature 0 as greedy, but dividing logits by it here gives NaN log-probs and gradients.
    if isinstance(temperature, numbers.Real) and not temperature > 0:
        raise ValueError(
            f"temperature must be > 0 to score tokens, got {temperature}; "
            "for greedy samples pass the sampler's policy_temperature (1.0)"
        )


def token_logprobs_and_entropy_reference(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The same quantities computed naively through full [B, T, V] float32 logits (for tests and benchmarks)."""
    _check_temperature(temperature)
    logits = jnp.matmul(hidden, unembedding, preferred_element_type=jnp.float32)
    logits = _softcapped_scaled(logits, temperature, logit_softcap)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    taken = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return taken, entropy


@jax.named_scope("logprob_head")
def token_logprobs_and_entropy(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    logit_softcap: float | None = None,
    sequence_chunk: int = 128,
    vocab_chunk: int = 8192,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of each target token and the entropy of each next-token distribution.

    Args:
      hidden: final hidden states [B, T, E] (after the final norm).
      unembedding: output projection [E, V].
      targets: int token ids [B, T] whose log-probabilities to return.
      temperature: divides the logits (1.0 = the model's own distribution); must be > 0.
      logit_softcap: Gemma's final soft-capping `cap * tanh(z / cap)`, applied before temperature.
      sequence_chunk, vocab_chunk: block sizes; T and V need not be multiples.

    Returns:
      (log_probs [B, T], entropy [B, T]), float32.
    """
    chex.assert_rank([hidden, unembedding, targets], [3, 2, 2])
    _check_temperature(temperature)
    chex.assert_equal_shape_prefix([hidden, targets], 2)
    batch, length, width = hidden.shape
    vocab = unembedding.shape[1]
    if unembedding.shape[0] != width:
        raise ValueError(f"unembedding is {unembedding.shape} but hidden states have width {width}")
    sequence_chunk = min(sequence_chunk, length)
    vocab_chunk = min(vocab_chunk, vocab)
    num_sequence_chunks = -(-length // sequence_chunk)
    num_vocab_chunks = -(-vocab // vocab_chunk)

    # Pad only when the chunks do not tile the arrays; otherwise chunks are sliced in place.
    padded_length = num_sequence_chunks * sequence_chunk
    if padded_length != length:
        hidden = jnp.pad(hidden, ((0, 0), (0, padded_length - length), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, padded_length - length)))
    padded_vocab = num_vocab_chunks * vocab_chunk
    if padded_vocab != vocab:
        unembedding = jnp.pad(unembedding, ((0, 0), (0, padded_vocab - vocab)))

    @jax.checkpoint
    def sequence_block(position):
        h = jax.lax.dynamic_slice_in_dim(hidden, position, sequence_chunk, axis=1)  # [B, chunk, E]
        y = jax.lax.dynamic_slice_in_dim(targets, position, sequence_chunk, axis=1)  # [B, chunk]

        def vocab_block(carry, start):
            running_max, normalizer, weighted_sum, target_logit = carry
            w = jax.lax.dynamic_slice_in_dim(unembedding, start, vocab_chunk, axis=1)
            z = _softcapped_scaled(jnp.matmul(h, w, preferred_element_type=jnp.float32), temperature, logit_softcap)
            column = start + jnp.arange(vocab_chunk)
            z = jnp.where(column < vocab, z, _PADDING_LOGIT)
            new_max = jnp.maximum(running_max, z.max(axis=-1))
            rescale = jnp.exp(running_max - new_max)
            p = jnp.exp(z - new_max[..., None])
            normalizer = normalizer * rescale + p.sum(axis=-1)
            weighted_sum = weighted_sum * rescale + (p * z).sum(axis=-1)
            target_logit = target_logit + jnp.where(column == y[..., None], z, 0.0).sum(axis=-1)
            return (new_max, normalizer, weighted_sum, target_logit), None

        zeros = jnp.zeros(y.shape, jnp.float32)
        init = (jnp.full(y.shape, _PADDING_LOGIT), zeros, zeros, zeros)
        starts = jnp.arange(num_vocab_chunks) * vocab_chunk
        (running_max, normalizer, weighted_sum, target_logit), _ = jax.lax.scan(vocab_block, init, starts)
        log_normalizer = running_max + jnp.log(normalizer)
        return target_logit - log_normalizer, log_normalizer - weighted_sum / normalizer

    log_probs, entropy = jax.lax.map(sequence_block, jnp.arange(num_sequence_chunks) * sequence_chunk)
    unchunk = lambda x: x.swapaxes(0, 1).reshape(batch, padded_length)[:, :length]  # noqa: E731
    return unchunk(log_probs), unchunk(entropy)
