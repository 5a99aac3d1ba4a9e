"""Continuous batching against fixed batches: the rollout engine on long-tailed completion lengths.

R requests (default 1024) with short prompts; most completions stop early and a few run to the budget
(each request's length is its `max_new_tokens`, drawn once from a seeded long-tailed mix: 85% uniform in
[1, budget/8], 15% the whole budget, so the lengths are the same in every run). Two ways through S
decode slots (default 128), timed after a warm-up run (compilation excluded), alternating, medians:

- continuous: `Engine(num_slots=S).generate(all requests)`, a slot refilled as soon as its row finishes;
- fixed (engine): the same engine given the requests S at a time, each batch waiting for its longest row.

    python benchmarks/engine_batching.py [--model toy|smollm2] [--requests 1024] [--slots 128] [--budget 128]
                                         [--repeats 3]

The acceptance bound is continuous <= 0.6 x fixed (engine); the ratio is printed per pair and as a median.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import numpy as np

from jaxgrpo import sampler
from jaxgrpo.engine import Engine, Request
from jaxgrpo.sampler import SamplingParams


def long_tailed_requests(count: int, budget: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < 0.85, rng.integers(1, max(2, budget // 8) + 1, count), budget)
    prompts = [rng.integers(4, vocab, size=int(rng.integers(8, 17))).tolist() for _ in range(count)]
    return [Request(id=i, prompt=p, max_new_tokens=int(n), sampling=SamplingParams(temperature=1.0))
            for i, (p, n) in enumerate(zip(prompts, lengths))]


def load(name: str):
    if name == "toy":
        from jaxgrpo.data.toy import tiny_model

        model, _ = tiny_model(0)
        return model
    import jaxgrpo.models

    model, _ = jaxgrpo.models.load("smollm2-135m-instruct")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("toy", "smollm2"), default="toy")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--slots", type=int, default=128)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model = load(args.model)
    requests = long_tailed_requests(args.requests, args.budget, model.config.vocab_size)
    lengths = np.array([r.max_new_tokens for r in requests])
    context = sampler.bucket_length(max(len(r.prompt) for r in requests) + args.budget)
    engine = Engine(model, num_slots=args.slots, max_context=context, key=jax.random.key(0))
    batches = [requests[i:i + args.slots] for i in range(0, len(requests), args.slots)]

    def continuous():
        return engine.generate(requests)

    def fixed_engine():
        return [c for batch in batches for c in engine.generate(batch)]

    ways = {"continuous": continuous, "fixed (engine)": fixed_engine}
    for name, run in ways.items():  # warm-up: compile every shape
        start = time.perf_counter()
        run()
        print(f"warm-up {name}: {time.perf_counter() - start:.2f} s", flush=True)
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, run in ways.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
            print(f"{name}: {times[name][-1]:.2f} s", flush=True)

    print(f"# {args.model}, {args.requests} requests through {args.slots} slots, budget {args.budget}; lengths: "
          f"mean {lengths.mean():.1f}, median {np.median(lengths):.0f}, {np.mean(lengths == args.budget):.0%} at the "
          f"budget ({lengths.sum()} tokens); host {platform.processor() or platform.machine()}, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}")
    print("| way | median s | min s | max s | tokens/s |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} | "
              f"{lengths.sum() / statistics.median(values):.0f} |")
    ratios = [c / f for c, f in zip(times["continuous"], times["fixed (engine)"])]
    print(f"continuous / fixed (engine): median {statistics.median(ratios):.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
