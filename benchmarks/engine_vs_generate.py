"""The trainer's sampling call through the rollout engine against `sampler.generate`, at the main job's shapes.

The trainer samples through `engine.generate_groups` (one slot per sample, the engine built as `Trainer.engine` builds
it); until 2026-12-06 it could sample through `sampler.generate`'s fixed batch instead. This times
one such call both ways on the same prompts, after a warm-up call of each (compilation excluded), alternating, and
reports medians, their ratio, and the engine's host-side share: the seconds its Python spends outside the
device programs (admission, block tables, bookkeeping), from `cProfile` over one extra call. Both draw a token
with the same key (prompt id, sample, index in the completion), so it also reports the share of the timed
calls' completions that are identical both ways: below 1 only where the two paths' logits differ enough to
move a draw.

    python benchmarks/engine_vs_generate.py [--model toy|smollm2] [--prompts 8] [--samples 8]
                                            [--max-new-tokens 16] [--prompt-len 64 192] [--repeats 5]

Defaults are experiments/quickstart.py's step: 8 prompts x 8 samples, 16 new tokens, prompts of 64-192 tokens.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import statistics
import time

import jax
import numpy as np

from jaxgrpo import engine as engine_lib
from jaxgrpo import sampler

from engine_batching import load  # noqa: E402 (a sibling script: the same two models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("toy", "smollm2"), default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(64, 192), metavar=("MIN", "MAX"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    model = load(args.model)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, vocab, int(rng.integers(args.prompt_len[0], args.prompt_len[1] + 1))).tolist()
               for _ in range(args.prompts)]
    n, g = args.max_new_tokens, args.samples
    context = sampler.bucket_length(args.prompt_len[1]) + n
    window = sampler.model_context_window(model)
    engine = engine_lib.Engine(model, num_slots=args.prompts * g, max_context=context if window is None else
                               min(context, window), decode_chunk=n)
    params = sampler.SamplingParams(temperature=1.0)

    def through_engine(key):
        return jax.block_until_ready(engine_lib.generate_groups(engine, prompts, num_samples=g, max_new_tokens=n,
                                                                sampling=params, key=key))

    def through_generate(key):
        return jax.block_until_ready(sampler.generate(model, prompts, num_samples=g, max_new_tokens=n, key=key,
                                                      temperature=1.0))

    ways = {"generate": through_generate, "engine": through_engine}
    for fn in ways.values():  # warm-up: compile
        fn(jax.random.key(0))
    times = {name: [] for name in ways}
    identical = []
    for r in range(args.repeats):
        outs = {}
        for name in (ways if r % 2 == 0 else reversed(list(ways))):
            start = time.perf_counter()
            outs[name] = ways[name](jax.random.key(r + 1))
            times[name].append(time.perf_counter() - start)
        tokens = [np.asarray(outs[name].completion_tokens) for name in ways]
        identical += list((tokens[0] == tokens[1]).all(axis=1))

    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    through_engine(jax.random.key(99))
    profile.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profile)
    # Time inside jax (dispatch, transfers, waiting for the device) counts as jax's; the rest is the engine's Python.
    device = sum(tt for (file, _, fn), (_, _, tt, _, _) in stats.stats.items()
                 if "/jax/" in file or "jaxlib" in file or "block_until_ready" in fn)

    print(f"host: {platform.processor() or platform.machine()}; {args.model}, {args.prompts} prompts x {g} samples, "
          f"{n} new tokens, prompts of {args.prompt_len[0]}-{args.prompt_len[1]} tokens, {args.repeats} alternating "
          "repeats")
    for name, values in times.items():
        print(f"  {name:9s} median {statistics.median(values):.3f} s  (min {min(values):.3f}, max {max(values):.3f})")
    ratios = [e / s for e, s in zip(times["engine"], times["generate"])]
    print(f"  engine / generate: median ratio {statistics.median(ratios):.2f} (pairs {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"  identical completions (same key both ways): {np.mean(identical):.3f} of {len(identical)}")
    print(f"  engine call under cProfile: {total:.3f} s, of which ~{max(total - device, 0):.3f} s host Python outside "
          "jax calls; top host functions:")
    stats.sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
