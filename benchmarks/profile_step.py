"""Where the time goes: a traced decode step and a traced training step of SmolLM2-135M (float32).

    python benchmarks/profile_step.py [--decode-steps 32] [--train 8x64+128] [--calls 2]

Both programs run under `jax.profiler.trace`, and `jaxgrpo.profiling` sums the exclusive time of every
XLA instruction under the named scope of the model part it belongs to (attention projections, attention
core, MLP, the layers' weights sliced out of the stack, unembedding, log-prob head, sampling, ...;
backward instructions apart). The settings are the other benchmarks':

1. decode: the rollout engine's decode chunk at the sampler benchmark's batch (8 prompts x G=4 = 32
   slots, 64-token prompts, a context of 64 + 128), `--decode-steps` steps per chunk: each call prefills
   the 32 requests (untraced), then runs and traces one chunk as the engine does (`Engine.decode`: each
   prompt's samples reading its blocks once, as a shared prefix);
2. training: one micro-batch of the GRPO step benchmark (8 rows of a 64-token prompt and 128
   completion tokens), the gradient of the trainer's `completion_outputs` log-probs (the decoder,
   then the chunked log-prob head on the completion positions), with the layers rematerialized as
   the trainer does by default (`--no-remat` to store their activations instead).

Tracing adds overhead to every instruction, so the table gives shares (and the traced and untraced
wall time per call, for scale). Prints markdown tables; `--out` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def decode_breakdown(model, prompts, samples: int, steps: int, calls: int, context: int):
    """The rollout engine's decode chunk of `steps` steps over `samples` samples of each of `prompts`, as it
    runs after their prefill, in an engine of `context` positions per slot: `calls` chunks, each prefilled
    untraced and then traced alone (`profiling.summarize_steps`), their part times averaged."""
    from jaxgrpo import profiling, sampler
    from jaxgrpo.engine import Engine, Request

    rows = len(prompts) * samples
    engine = Engine(model, num_slots=rows, max_context=context, decode_chunk=steps, key=jax.random.key(0))
    params = sampler.SamplingParams(temperature=1.0)
    # The first token comes from the prefill: `steps` more fill exactly one chunk.
    requests = [Request(id=b * samples + g, prompt=list(p), max_new_tokens=steps + 1, sampling=params,
                        draw_origin=len(p)) for b, p in enumerate(prompts) for g in range(samples)]

    def chunk(trace_dir: str | None = None) -> float:
        """Seconds of one decode chunk after a prefill of the requests (traced into `trace_dir` if given)."""
        engine.prefill(requests)
        jax.block_until_ready(engine.cache)  # the prefill's block copies finish outside the traced chunk
        with jax.profiler.trace(trace_dir) if trace_dir else contextlib.nullcontext():
            start = time.perf_counter()
            engine.decode()
            wall = time.perf_counter() - start
        for r in requests:
            engine.release(r.id)
        return wall

    chunk()  # compiles
    walls = sorted(chunk() for _ in range(calls))
    traced = []
    for _ in range(calls):
        with tempfile.TemporaryDirectory() as directory:
            traced.append(profiling.summarize_steps(directory, (1, 1), chunk(directory)))

    def mean(field: str) -> dict[str, float]:
        totals = collections.Counter()
        for profile in traced:
            totals.update(getattr(profile, field))
        return {name: seconds / calls for name, seconds in totals.most_common()}

    breakdown = profiling.Breakdown(
        seconds=mean("parts"), wall_seconds=walls[len(walls) // 2],
        traced_wall_seconds=sum(p.wall_seconds for p in traced) / calls, calls=calls,
        instructions=dict(list(mean("instructions").items())[:12]))
    title = (f"Decode: {rows} rows ({len(prompts)} prompts x G={samples}), prompt {len(prompts[0])}, the engine's "
             f"decode chunk (context {context}), {steps} tokens per call")
    return title, breakdown, {"steps": steps, "rows": rows}


def train_breakdown(model, batch: int, prompt: int, completion: int, calls: int):
    from jaxgrpo import profiling
    from jaxgrpo.train import Policy, completion_outputs

    graphdef, params, rest = nnx.split(Policy(model), nnx.Param, ...)
    length = prompt + completion

    def loss(p, tokens, mask, positions):
        logp, entropy, _ = completion_outputs(nnx.merge(graphdef, p, rest), tokens, mask, positions, completion, 1.0,
                                              with_values=False)
        return -logp.mean() + 0.0 * entropy.mean()

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, model.config.vocab_size, (batch, length)), jnp.int32)
    mask = jnp.ones((batch, length), bool)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    args = (params, tokens, mask, positions)
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    breakdown = profiling.time_by_scope(compiled, args, calls=calls)
    title = (f"Training: forward + backward, {batch} rows x ({prompt} prompt + {completion} completion) tokens, "
             + ("layers rematerialized" if getattr(model, "remat", False) else "activations stored"))
    return title, breakdown, {"batch": batch, "prompt": prompt, "completion": completion}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--train", default="8x64+128", help="rows x prompt+completion tokens")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--no-remat", dest="remat", action="store_false",
                        help="store the layers' activations instead of recomputing them (the trainer's default is remat)")
    parser.add_argument("--out", default=None, help="also write the breakdowns as JSON")
    args = parser.parse_args()
    try:
        rows, lengths = args.train.lower().split("x")
        prompt, completion = map(int, lengths.split("+"))
        rows = int(rows)
    except ValueError:
        parser.error(f"--train must look like 8x64+128 (rows x prompt+completion), got {args.train!r}")

    import jaxgrpo.models
    from jaxgrpo import profiling
    from sampler import NEW_TOKENS, PROMPT_LENGTH, SAMPLES, benchmark_prompts

    model, tokenizer = jaxgrpo.models.load(args.model, remat=args.remat)
    results = []
    for title, breakdown, settings in (decode_breakdown(model, benchmark_prompts(tokenizer).tolist(), SAMPLES,
                                                        args.decode_steps, args.calls, PROMPT_LENGTH + NEW_TOKENS),
                                       train_breakdown(model, rows, prompt, completion, args.calls)):
        print(f"\n### {title}\n")
        print(profiling.markdown(breakdown))
        print("\nCostliest instructions: " + "; ".join(
            f"{name} {seconds * 1e3:.1f} ms" for name, seconds in list(breakdown.instructions.items())[:6]), flush=True)
        results.append({"title": title, "settings": settings, "seconds": breakdown.seconds,
                        "wall_seconds": breakdown.wall_seconds, "traced_wall_seconds": breakdown.traced_wall_seconds,
                        "coverage": breakdown.coverage, "instructions": breakdown.instructions})
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"benchmark": "profile_step", "model": args.model, "jax": jax.__version__, "breakdowns": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
