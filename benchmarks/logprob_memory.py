"""Compiled temporary memory of per-token log-probs + entropy: chunked vs naive full logits.

    python benchmarks/logprob_memory.py [--batch 8 --length 1024 --vocab 49152 --hidden 576]

Nothing is executed: both functions are lowered on abstract inputs and XLA's memory analysis of
the compiled programs is read (`jax.jit(f).lower(...).compile().memory_analysis()`). The
acceptance bar (issue 4) is chunked <= 25% of naive at B=8, T=1024, V=49152.
"""

import argparse
import functools

import jax
import jax.numpy as jnp

from jaxgrpo.models.logprobs import token_logprobs_and_entropy, token_logprobs_and_entropy_reference


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--sequence-chunk", type=int, default=128)
    parser.add_argument("--vocab-chunk", type=int, default=8192)
    args = parser.parse_args()

    hidden = jax.ShapeDtypeStruct((args.batch, args.length, args.hidden), jnp.float32)
    unembedding = jax.ShapeDtypeStruct((args.hidden, args.vocab), jnp.float32)
    targets = jax.ShapeDtypeStruct((args.batch, args.length), jnp.int32)
    chunked = functools.partial(token_logprobs_and_entropy, sequence_chunk=args.sequence_chunk, vocab_chunk=args.vocab_chunk)
    naive = token_logprobs_and_entropy_reference

    def gradient(fn):
        def loss(hidden, unembedding, targets):
            log_probs, entropy = fn(hidden, unembedding, targets)
            return jnp.sum(log_probs) + jnp.sum(entropy)

        return jax.grad(loss, argnums=(0, 1))

    print(f"B={args.batch}, T={args.length}, V={args.vocab}, hidden={args.hidden}, float32; "
          f"chunks: sequence {args.sequence_chunk}, vocabulary {args.vocab_chunk}\n")
    print("| computation | naive temp (MiB) | chunked temp (MiB) | chunked / naive |")
    print("|---|---|---|---|")
    for label, make in (("log-probs + entropy", lambda f: f), ("gradient (hidden, unembedding)", gradient)):
        naive_bytes = temp_bytes(make(naive), hidden, unembedding, targets)
        chunked_bytes = temp_bytes(make(chunked), hidden, unembedding, targets)
        print(f"| {label} | {naive_bytes / 2**20:,.1f} | {chunked_bytes / 2**20:,.1f} | {chunked_bytes / naive_bytes:.1%} |")


if __name__ == "__main__":
    main()
