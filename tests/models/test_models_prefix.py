"""Prefix Grouper (METHODS.md item 36): the shared-prefix forward equals the replicated batch,
in logits and in gradients (G = 3, atol 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.support.tiny_models import llama_and_gemma3

from jaxgrpo.models import Decoder
from jaxgrpo.models.prefix import shared_prefix_logits, shared_prefix_token_logprobs

CONFIGS = llama_and_gemma3(sliding_window=4)
NUM_PROMPTS, GROUP, PROMPT, COMPLETION = 2, 3, 6, 4


def _batch(vocab):
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, vocab, (NUM_PROMPTS, PROMPT))
    prompt_mask = np.ones((NUM_PROMPTS, PROMPT), bool)
    prompt_mask[1, :2] = False  # left padding
    completions = rng.integers(0, vocab, (NUM_PROMPTS, GROUP, COMPLETION))
    replicated = np.concatenate([np.repeat(prompts, GROUP, axis=0), completions.reshape(-1, COMPLETION)], axis=1)
    replicated_mask = np.concatenate([np.repeat(prompt_mask, GROUP, axis=0), np.ones((NUM_PROMPTS * GROUP, COMPLETION), bool)], axis=1)
    return [jnp.asarray(x) for x in (prompts, prompt_mask, completions, replicated, replicated_mask)]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_shared_prefix_logits_equal_replicated_batch(family):
    model = Decoder(CONFIGS[family], rngs=nnx.Rngs(0))
    prompts, prompt_mask, completions, replicated, replicated_mask = _batch(CONFIGS[family].vocab_size)
    graphdef, params = nnx.split(model)

    prompt_logits, completion_logits = jax.jit(lambda p: shared_prefix_logits(nnx.merge(graphdef, p), prompts, prompt_mask, completions))(params)
    full = jax.jit(lambda p: nnx.merge(graphdef, p)(replicated, attention_mask=replicated_mask))(params)
    full = full.reshape(NUM_PROMPTS, GROUP, PROMPT + COMPLETION, -1)
    np.testing.assert_allclose(np.asarray(completion_logits), np.asarray(full[:, :, PROMPT:]), atol=1e-5)
    real = np.asarray(prompt_mask)
    for g in range(GROUP):
        np.testing.assert_allclose(np.asarray(prompt_logits)[real], np.asarray(full[:, g, :PROMPT])[real], atol=1e-5)


def test_shared_prefix_gradients_equal_replicated_batch():
    model = Decoder(CONFIGS["llama"], rngs=nnx.Rngs(0))
    prompts, prompt_mask, completions, replicated, replicated_mask = _batch(CONFIGS["llama"].vocab_size)
    graphdef, params = nnx.split(model)
    weights = jax.random.normal(jax.random.key(1), (NUM_PROMPTS, GROUP, COMPLETION))

    def shared_loss(p):
        log_probs, entropy = shared_prefix_token_logprobs(nnx.merge(graphdef, p), prompts, prompt_mask, completions, temperature=0.9)
        return jnp.sum(weights * log_probs) + 0.1 * jnp.sum(entropy)

    def replicated_loss(p):
        targets = jnp.roll(replicated, -1, axis=1)
        log_probs, entropy = nnx.merge(graphdef, p).token_logprobs(replicated, targets, attention_mask=replicated_mask, temperature=0.9)
        completion = slice(PROMPT - 1, PROMPT + COMPLETION - 1)  # the positions that predict completion tokens
        shape = (NUM_PROMPTS, GROUP, COMPLETION)
        return jnp.sum(weights * log_probs[:, completion].reshape(shape)) + 0.1 * jnp.sum(entropy[:, completion])

    shared_value, shared_grads = jax.jit(jax.value_and_grad(shared_loss))(params)
    value, grads = jax.jit(jax.value_and_grad(replicated_loss))(params)
    np.testing.assert_allclose(float(shared_value), float(value), atol=1e-5)
    for got, want in zip(jax.tree.leaves(shared_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    assert any(np.abs(np.asarray(g)).max() > 1e-3 for g in jax.tree.leaves(grads))
