"""Reference computations the tests hold the fast paths to: plain, slow, obviously right."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@functools.partial(jax.jit, static_argnums=0)
def _full_forward(graphdef, state, tokens, mask):
    return nnx.merge(graphdef, state)(tokens, attention_mask=mask)


def greedy_without_cache(model, prompts, new_tokens: int) -> np.ndarray:
    """Greedy decoding as step-by-step argmax of `model`'s full forwards, no cache: int [B, new_tokens]."""
    # Right-padded; causal attention keeps the padding out of every real position.
    length = 1 << (max(map(len, prompts)) + new_tokens - 1).bit_length()
    tokens = np.zeros((len(prompts), length), np.int32)
    ends = np.array([len(p) for p in prompts])
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    forward, rows = functools.partial(_full_forward, *nnx.split(model)), np.arange(len(prompts))
    for _ in range(new_tokens):
        mask = np.arange(length)[None] < ends[:, None]
        logits = np.asarray(forward(jnp.asarray(tokens), jnp.asarray(mask)))
        tokens[rows, ends] = logits[rows, ends - 1].argmax(-1)
        ends += 1
    return np.stack([tokens[row, len(p): len(p) + new_tokens] for row, p in enumerate(prompts)])
