"""Per-token log-probabilities and entropies from hidden states, without materializing [B, T, V] logits.

For final hidden states h [B, T, E] and the output projection W [E, V], the logits of token t are
z = softcap(h_t W) / temperature, and

    log p(y_t) = z[y_t] - logsumexp(z),        entropy_t = logsumexp(z) - sum_v softmax(z)_v z_v.

`token_logprobs_and_entropy` walks the sequence in chunks (`lax.map`) and, inside each, the vocabulary
in chunks (`lax.scan`) with an online logsumexp ("Online normalizer calculation for softmax",
Milakov & Gimelshein 2018), so the largest logits block alive is [B, sequence_chunk, vocab_chunk].
The backward pass is written out (a `custom_vjp`): it recomputes each block's logits from the saved logsumexp
and mean logit and turns them into the gradients of the hidden states and the projection at once, so no block
of logits is stored between the passes and the gradients stay as small.
Temperature divides the (soft-capped) logits, exactly as the sampler does.
"""

from __future__ import annotations

import functools
import numbers

import chex
import jax
import jax.numpy as jnp

from jaxgrpo.models import backend

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
    sequence_chunk: int | None = None,
    vocab_chunk: int = 8192,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of each target token and the entropy of each next-token distribution.

    Args:
      hidden: final hidden states [B, T, E] (after the final norm).
      unembedding: output projection [E, V].
      targets: int token ids [B, T] whose log-probabilities to return.
      temperature: divides the logits (1.0 = the model's own distribution); must be > 0.
      logit_softcap: Gemma's final soft-capping `cap * tanh(z / cap)`, applied before temperature.
      sequence_chunk, vocab_chunk: block sizes; T and V need not be multiples. `sequence_chunk` None: the
        program's memory forms choose (`MemoryForms.logits_block_positions`: 128 positions on a CPU, up to 8192
        tokens a block on an accelerator).

    Returns:
      (log_probs [B, T], entropy [B, T]), float32.
    """
    chex.assert_rank([hidden, unembedding, targets], [3, 2, 2])
    _check_temperature(temperature)
    chex.assert_equal_shape_prefix([hidden, targets], 2)
    _, length, width = hidden.shape
    vocab = unembedding.shape[1]
    if unembedding.shape[0] != width:
        raise ValueError(f"unembedding is {unembedding.shape} but hidden states have width {width}")
    forms = backend.memory_for_program()
    sequence_chunk = min(sequence_chunk or forms.logits_block_positions(hidden.shape[0], length), length)
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

    log_probs, entropy = _chunked_logprobs(hidden, unembedding, targets, jnp.asarray(temperature, jnp.float32),
                                           logit_softcap, sequence_chunk, vocab_chunk, vocab, forms.online_softmax)
    return log_probs[:, :length], entropy[:, :length]


def _logits(h, w, start, temperature, logit_softcap, vocab):
    """(z, a): the soft-capped, tempered logits [..., chunk] of hidden states `h` against the vocabulary chunk `w`
    beginning at column `start` (padding columns at `_PADDING_LOGIT`), and the products a = h w they come from."""
    a = jnp.matmul(h, w, preferred_element_type=jnp.float32)
    column = start + jnp.arange(w.shape[1])
    return jnp.where(column < vocab, _softcapped_scaled(a, temperature, logit_softcap), _PADDING_LOGIT), a


def _forward(hidden, unembedding, targets, temperature, logit_softcap, sequence_chunk, vocab_chunk, vocab,
             online_softmax):
    """(log p, entropy, logsumexp, mean logit) [B, T] of chunk-tiled inputs: each sequence chunk against each
    vocabulary chunk in turn, with an online logsumexp, so the largest block alive is [B, sequence_chunk,
    vocab_chunk]. `online_softmax` takes in a block (the memory forms': `memory_forms.one_pass_online_softmax` or
    `two_pass_online_softmax`)."""
    starts = jnp.arange(unembedding.shape[1] // vocab_chunk) * vocab_chunk

    def sequence_block(position):
        h = jax.lax.dynamic_slice_in_dim(hidden, position, sequence_chunk, axis=1)  # [B, chunk, E]
        y = jax.lax.dynamic_slice_in_dim(targets, position, sequence_chunk, axis=1)  # [B, chunk]

        def vocab_block(carry, start):
            softmax, target_logit = carry
            w = jax.lax.dynamic_slice_in_dim(unembedding, start, vocab_chunk, axis=1)
            z, _ = _logits(h, w, start, temperature, logit_softcap, vocab)
            softmax = online_softmax(softmax, z)
            column = start + jnp.arange(vocab_chunk)
            target_logit = target_logit + jnp.where(column == y[..., None], z, 0.0).sum(axis=-1)
            return (softmax, target_logit), None

        zeros = jnp.zeros(y.shape, jnp.float32)
        init = ((jnp.full(y.shape, _PADDING_LOGIT), zeros, zeros), zeros)
        ((running_max, normalizer, weighted_sum), target_logit), _ = jax.lax.scan(vocab_block, init, starts)
        log_normalizer = running_max + jnp.log(normalizer)
        mean_logit = weighted_sum / normalizer
        return target_logit - log_normalizer, log_normalizer - mean_logit, log_normalizer, mean_logit

    positions = jnp.arange(hidden.shape[1] // sequence_chunk) * sequence_chunk
    unchunk = lambda x: x.swapaxes(0, 1).reshape(hidden.shape[:2])  # noqa: E731  [chunks, B, chunk] -> [B, T]
    return tuple(unchunk(x) for x in jax.lax.map(sequence_block, positions))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _chunked_logprobs(hidden, unembedding, targets, temperature, logit_softcap, sequence_chunk, vocab_chunk, vocab,
                      online_softmax):
    """(log p, entropy) [B, T] of chunk-tiled inputs (`_forward`), with a backward pass of its own
    (`_chunked_backward`): differentiating the chunk loops would store every vocabulary chunk's logits and masks
    for the backward pass, [vocab chunks, B, sequence_chunk, vocab_chunk] float32 for each sequence chunk, and
    read them back through several passes (compiled for an H100, most of an update's memory traffic outside its
    products)."""
    log_probs, entropy, _, _ = _forward(hidden, unembedding, targets, temperature, logit_softcap, sequence_chunk,
                                        vocab_chunk, vocab, online_softmax)
    return log_probs, entropy


def _chunked_forward(hidden, unembedding, targets, temperature, logit_softcap, sequence_chunk, vocab_chunk, vocab,
                     online_softmax):
    log_probs, entropy, log_normalizer, mean_logit = _forward(hidden, unembedding, targets, temperature,
                                                              logit_softcap, sequence_chunk, vocab_chunk, vocab,
                                                              online_softmax)
    return (log_probs, entropy), (hidden, unembedding, targets, temperature, log_normalizer, mean_logit)


def _chunked_backward(logit_softcap, sequence_chunk, vocab_chunk, vocab, online_softmax, residuals, cotangents):
    """Gradients of (log p, entropy) by recomputing each block's logits z: with p = softmax(z) and g, k the
    cotangents of log p(y) and of the entropy, dz = g (onehot(y) - p) - k p (z - E_p[z]); through the soft cap
    and temperature, da = dz (1 - tanh(a / cap)^2) / temperature; dh = da W^T, dW = h^T da. Outer loop over
    vocabulary chunks (each chunk's dW summed over the sequence chunks in place), inner over sequence chunks (their
    dh added in place): no block outlives its step."""
    hidden, unembedding, targets, temperature, log_normalizer, mean_logit = residuals
    d_log_probs, d_entropy = cotangents
    positions = jnp.arange(hidden.shape[1] // sequence_chunk) * sequence_chunk
    starts = jnp.arange(unembedding.shape[1] // vocab_chunk) * vocab_chunk

    def vocab_block(d_hidden, start):
        w = jax.lax.dynamic_slice_in_dim(unembedding, start, vocab_chunk, axis=1)  # [E, chunk]
        column = start + jnp.arange(vocab_chunk)

        def sequence_block(carry, position):
            d_hidden, d_w = carry
            part = lambda x: jax.lax.dynamic_slice_in_dim(x, position, sequence_chunk, axis=1)  # noqa: E731
            h, y = part(hidden), part(targets)
            z, a = _logits(h, w, start, temperature, logit_softcap, vocab)
            p = jnp.exp(z - part(log_normalizer)[..., None])
            d_z = (part(d_log_probs)[..., None] * ((column == y[..., None]) - p)
                   - part(d_entropy)[..., None] * p * (z - part(mean_logit)[..., None]))
            d_z = jnp.where(column < vocab, d_z, 0.0)
            if logit_softcap is not None:
                d_z = d_z * (1.0 - jnp.square(jnp.tanh(a / logit_softcap)))
            d_a = (d_z / temperature).astype(w.dtype)
            d_h = jnp.matmul(d_a, w.T, preferred_element_type=jnp.float32)
            d_hidden = jax.lax.dynamic_update_slice_in_dim(d_hidden, part(d_hidden) + d_h, position, axis=1)
            d_w = d_w + jnp.einsum("bte,btv->ev", h, d_a, preferred_element_type=jnp.float32)
            return (d_hidden, d_w), None

        d_w = jnp.zeros(w.shape, jnp.float32)
        (d_hidden, d_w), _ = jax.lax.scan(sequence_block, (d_hidden, d_w), positions)
        return d_hidden, d_w.astype(unembedding.dtype)

    d_hidden, d_w = jax.lax.scan(vocab_block, jnp.zeros(hidden.shape, jnp.float32), starts)
    d_unembedding = jnp.moveaxis(d_w, 0, 1).reshape(unembedding.shape)  # [chunks, E, chunk] -> [E, V]
    return d_hidden.astype(hidden.dtype), d_unembedding, None, jnp.zeros_like(temperature)


_chunked_logprobs.defvjp(_chunked_forward, _chunked_backward)
