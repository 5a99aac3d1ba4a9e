"""Token entropy from logits, chunked over the vocabulary.

Streaming the vocabulary in chunks (an online log-sum-exp) keeps the float32
working set at [N, T, chunk] even when the logits are bfloat16 [N, T, V].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def entropy_from_logits(logits, *, chunk_size: int = 4096, temperature: float = 1.0) -> Array:
    """H_t = logsumexp(z) - sum_v softmax(z)_v z_v, with z = logits / temperature, in float32.

    Args:
      logits: [..., V] in any floating dtype.
      chunk_size: vocabulary chunk; V is padded up to a multiple of it.
      temperature: the sampling temperature the entropy refers to.

    Returns:
      float32 [...] entropies (nats).
    """
    if not jnp.issubdtype(jnp.asarray(logits).dtype, jnp.floating):
        raise TypeError(f"logits must be floating-point, got dtype {jnp.asarray(logits).dtype}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = logits.shape[-1]
    chunk = min(chunk_size, vocab)
    num_chunks = -(-vocab // chunk)
    pad = num_chunks * chunk - vocab
    lead = logits.shape[:-1]
    padded = jnp.pad(logits, [(0, 0)] * len(lead) + [(0, pad)], constant_values=-jnp.inf)
    chunks = jnp.moveaxis(padded.reshape(lead + (num_chunks, chunk)), -2, 0)

    def step(carry, z):
        m, s, t = carry  # running max, sum exp(z - m), sum exp(z - m) * z
        z = z.astype(jnp.float32) / temperature
        new_m = jnp.maximum(m, jnp.max(z, axis=-1))
        # While every logit so far is -inf (e.g. a masked first chunk), shift by 0
        # instead: exp(-inf - -inf) would be NaN, exp(-inf - 0) is the right 0.
        shift = jnp.where(jnp.isfinite(new_m), new_m, 0.0)
        scale = jnp.exp(m - shift)
        e = jnp.exp(z - shift[..., None])
        zf = jnp.where(jnp.isfinite(z), z, 0.0)
        return (new_m, s * scale + e.sum(-1), t * scale + (e * zf).sum(-1)), None

    init = (jnp.full(lead, -jnp.inf, jnp.float32), jnp.zeros(lead, jnp.float32), jnp.zeros(lead, jnp.float32))
    (m, s, t), _ = jax.lax.scan(step, init, chunks)
    return m + jnp.log(s) - t / s
