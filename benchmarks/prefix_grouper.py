"""Time saved by the shared-prefix forward (Prefix Grouper) in a GRPO-shaped gradient step.

    python benchmarks/prefix_grouper.py [--prompt 512 --completion 128 --group 8 --prompts 1]

A randomly initialized decoder with SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 kv
heads, vocabulary 49152) computes the gradient of the group's completion log-probs two ways: the
replicated batch (each completion re-runs its prompt) and the shared prefix (the prompt runs once).
Prompt:completion is 4:1 and G = 8 by default. Reports the median of `--repeats` timed steps after
one compile; the two gradients are checked equal.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.models import Decoder, DecoderConfig
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.logprobs import token_logprobs_and_entropy
from jaxgrpo.models.prefix import shared_prefix_token_logprobs

SMOLLM2_135M = DecoderConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                             num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True)


def median_seconds(fn, *args, repeats):
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--layers", type=int, default=SMOLLM2_135M.num_layers)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = DecoderConfig(**{**SMOLLM2_135M.__dict__, "num_layers": args.layers, "layer_types": ()})
    graphdef, params = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    n, g, p, s = args.prompts, args.group, args.prompt, args.completion
    prompts = jnp.asarray(rng.integers(0, config.vocab_size, (n, p)), jnp.int32)
    prompt_mask = jnp.ones((n, p), bool)
    completions = jnp.asarray(rng.integers(0, config.vocab_size, (n, g, s)), jnp.int32)
    replicated = jnp.concatenate([jnp.repeat(prompts, g, axis=0), completions.reshape(n * g, s)], axis=1)
    targets = jnp.roll(replicated, -1, axis=1)

    def replicated_loss(params):
        # Project only the positions that predict completion tokens, as a trainer would.
        model = nnx.merge(graphdef, params)
        hidden = model.forward(replicated, jnp.arange(replicated.shape[1])[None],
                               AttentionLayout.padded(jnp.ones(replicated.shape, bool)))
        log_probs, _ = token_logprobs_and_entropy(hidden[:, p - 1 : p + s - 1], model.unembedding(), targets[:, p - 1 : p + s - 1])
        return jnp.mean(log_probs)

    def shared_loss(params):
        log_probs, _ = shared_prefix_token_logprobs(nnx.merge(graphdef, params), prompts, prompt_mask, completions)
        return jnp.mean(log_probs)

    replicated_step = jax.jit(jax.value_and_grad(replicated_loss))
    shared_step = jax.jit(jax.value_and_grad(shared_loss))
    (value, grads), (shared_value, shared_grads) = replicated_step(params), shared_step(params)
    gradient_error = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(shared_grads)))

    replicated_time = median_seconds(replicated_step, params, repeats=args.repeats)
    shared_time = median_seconds(shared_step, params, repeats=args.repeats)
    print(f"{config.num_layers}-layer SmolLM2-135M-shaped decoder, float32, {jax.devices()[0].platform}; "
          f"N={n} prompts x G={g}, prompt {p} : completion {s} tokens\n")
    print("| forward + backward | seconds (median) | speed-up |")
    print("|---|---|---|")
    print(f"| replicated batch | {replicated_time:.2f} | 1.00x |")
    print(f"| shared prefix | {shared_time:.2f} | {replicated_time / shared_time:.2f}x |")
    print(f"\n|loss difference| {abs(float(value) - float(shared_value)):.2e}, max |gradient difference| {gradient_error:.2e}")


if __name__ == "__main__":
    main()
