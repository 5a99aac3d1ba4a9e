"""Sampler benchmarks on SmolLM2-135M-Instruct (float32 by default, this machine's CPU or accelerator).

1. Throughput: 8 prompts x G=4 samples (batch 32), 64-token prompts, 128 new tokens, plain
   sampling at temperature 1 with no stop token (every row generates all 128 tokens), through the
   rollout engine (`jaxgrpo.engine.generate_groups` on one engine of 32 slots kept across calls, as the
   trainer keeps its own), against transformers' `generate` with torch on the same GGUF weights. Runs
   alternate in this process; the table reports medians of generated tokens/s (prefill included on both
   sides) and the median of the per-run ratios.
2. Capacity: the engine's per-step decode time at a capacity (`max_context`, which sizes its block
   tables and its pool of blocks for every slot) of 1024 versus 256 for the same live length (64-token
   prompts, batch 32), through its session API (`prefill`, then a timed `decode`): (time for 36 tokens -
   time for 4 tokens) / 32, the same compiled decode chunk both times.
3. Floor: what one decode step's weight products cost with the kernels a decode uses (the packed
   weights of `jaxgrpo.models.cpu_matmul` in bfloat16 where it is built, else XLA's): each distinct
   [32, in] x [in, out] product of a layer and the unembedding timed alone with warm caches, summed over
   the layers. A decode step cannot be faster than its weight products, so against transformers' time
   per generated token it bounds the ratio a sampler built on these kernels can reach.

    python benchmarks/sampler.py [--repeats 3] [--skip-torch] [--only throughput|capacity|floor] [--new-tokens 128]
                                 [--dtype float32|bfloat16] [--torch-dtype float32|bfloat16]

`--dtype bfloat16` runs both sides, and the floor's products, in bfloat16 (weights and compute);
`--torch-dtype` gives transformers another dtype than ours (float32 is its faster one on some CPUs).

Until 2026-12-06 the sampler was `sampler.generate`'s fixed batch: section 1 timed it (beside the engine) and
section 2 its cache's capacity. It is gone; the committed results in benchmarks/results/sampler*.md are its.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxgrpo.models
from jaxgrpo import sampler
from jaxgrpo.engine import Engine, Request, generate_groups
from jaxgrpo.models import cpu_forms, cpu_matmul, registry

PROMPTS, SAMPLES, PROMPT_LENGTH, NEW_TOKENS = 8, 4, 64, 128
DTYPE = "float32"
TORCH_DTYPE = None  # transformers' dtype: DTYPE unless --torch-dtype says otherwise

TEXT = (
    "Reinforcement learning from verifiable rewards trains a language model by sampling several answers to "
    "each question, scoring them with a checker, and pushing up the probability of the answers that scored "
    "above their group's average. Generation dominates the cost of every step, so the sampler must keep the "
    "accelerator busy: it shares the prompt's cache across samples, decodes inside one compiled loop and "
    "updates the cache in place. The trainer then recomputes the log-probabilities of the sampled tokens "
    "with the same weights. "
)


def benchmark_prompts(tokenizer) -> np.ndarray:
    """PROMPTS distinct prompts of exactly PROMPT_LENGTH tokens: int [PROMPTS, PROMPT_LENGTH]."""
    ids = tokenizer(TEXT * 8, add_special_tokens=False)["input_ids"]
    return np.stack([ids[7 * i: 7 * i + PROMPT_LENGTH] for i in range(PROMPTS)]).astype(np.int32)


def time_engine(engine, prompts: np.ndarray, seed: int) -> float:
    start = time.perf_counter()
    rollout = generate_groups(engine, prompts.tolist(), num_samples=SAMPLES, max_new_tokens=NEW_TOKENS,
                              sampling=sampler.SamplingParams(temperature=1.0), key=jax.random.key(seed))
    elapsed = time.perf_counter() - start
    assert int(rollout.completion_mask.sum()) == PROMPTS * SAMPLES * NEW_TOKENS
    return elapsed


def time_torch(hf_model, prompts: np.ndarray, seed: int) -> float:
    import torch

    torch.manual_seed(seed)
    input_ids = torch.tensor(prompts, dtype=torch.long)
    start = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=SAMPLES, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    assert out.shape == (PROMPTS * SAMPLES, PROMPT_LENGTH + NEW_TOKENS)
    return elapsed


def throughput(model, tokenizer, repeats: int, skip_torch: bool) -> float | None:
    """Prints the throughput table; returns transformers' median seconds per generated token of a row
    (its whole generation over NEW_TOKENS), or None without torch."""
    prompts = benchmark_prompts(tokenizer)
    tokens = PROMPTS * SAMPLES * NEW_TOKENS
    hf_model = None
    if not skip_torch:
        from transformers import AutoModelForCausalLM

        path = registry.resolve("smollm2-135m-instruct")
        import torch

        hf_model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                        dtype=getattr(torch, TORCH_DTYPE or DTYPE))
        hf_model.eval()
        time_torch(hf_model, prompts, 0)  # warm-up
    engine = Engine(model, num_slots=PROMPTS * SAMPLES, max_context=PROMPT_LENGTH + NEW_TOKENS,
                    decode_chunk=NEW_TOKENS)
    time_engine(engine, prompts, 0)  # compiles
    ours, theirs = [], []
    for repeat in range(repeats):
        ours.append(tokens / time_engine(engine, prompts, repeat + 1))
        if hf_model is not None:
            theirs.append(tokens / time_torch(hf_model, prompts, repeat + 1))
        print(f"  run {repeat}: jaxgrpo.engine {ours[-1]:.0f} tok/s"
              + (f", transformers {theirs[-1]:.0f} tok/s" if theirs else ""), flush=True)
    print(f"\n### Throughput: SmolLM2-135M-Instruct, {PROMPTS} prompts x G={SAMPLES}, {PROMPT_LENGTH}-token prompts, "
          f"{NEW_TOKENS} new tokens, {DTYPE}"
          + (f" (transformers in {TORCH_DTYPE})" if TORCH_DTYPE not in (None, DTYPE) else "")
          + f", {jax.devices()[0].platform}\n")
    print("| sampler | generated tokens/s (median) |")
    print("|---|---|")
    print(f"| jaxgrpo.engine, {PROMPTS * SAMPLES} slots (jax {jax.__version__}) | {statistics.median(ours):.0f} |")
    if theirs:
        import torch
        import transformers

        ratio = statistics.median(o / t for o, t in zip(ours, theirs))
        print(f"| transformers {transformers.__version__} generate (torch {torch.__version__}) | {statistics.median(theirs):.0f} |")
        print(f"| **ratio jaxgrpo / transformers (median of {repeats} alternating pairs)** | **{ratio:.2f}x** |")
        return PROMPTS * SAMPLES / statistics.median(theirs)
    return None


def capacity(model, tokenizer, repeats: int) -> float:
    """Prints the capacity table; returns the seconds of a decode step at capacity 256."""
    prompts = benchmark_prompts(tokenizer).tolist()
    params = sampler.SamplingParams(temperature=1.0)
    per_step = {}
    for cap in (256, 1024):
        # A chunk longer than the longest decode: every call runs one chunk of the same compiled program.
        engine = Engine(model, num_slots=PROMPTS * SAMPLES, max_context=cap, decode_chunk=64,
                        key=jax.random.key(0))

        def decode_time(new_tokens):
            requests = [Request(id=b * SAMPLES + g, prompt=p, max_new_tokens=new_tokens, sampling=params,
                                draw_origin=len(p)) for b, p in enumerate(prompts) for g in range(SAMPLES)]
            engine.prefill(requests)  # samples each row's first token
            start = time.perf_counter()
            engine.decode()  # the other new_tokens - 1, one step each
            elapsed = time.perf_counter() - start
            for r in requests:
                engine.release(r.id)
            return elapsed

        decode_time(5)  # compiles
        per_step[cap] = statistics.median((decode_time(37) - decode_time(5)) / 32 for _ in range(repeats))
    print(f"\n### Decode step versus the engine's capacity (batch {PROMPTS * SAMPLES}, live length {PROMPT_LENGTH}-"
          f"{PROMPT_LENGTH + 36})\n")
    print("| engine max_context | ms per decode step (median) |")
    print("|---|---|")
    for cap, seconds in per_step.items():
        print(f"| {cap} | {seconds * 1e3:.1f} |")
    print(f"| **ratio 1024 / 256** | **{per_step[1024] / per_step[256]:.2f}x** |")
    return per_step[256]


def weight_products(config, rows: int, repeats: int, dtype=jnp.float32) -> list[tuple[str, tuple[int, int], int, float]]:
    """(name, (in, out), count per decode step, median seconds) of each weight product of a decode step.

    Each product [rows, in] x [in, out] is timed alone, 20 times in one compiled loop (no Python
    dispatch between them), so its weight stays in cache: the best speed XLA's kernels reach on this
    machine for that shape.
    """
    calls = 20

    @jax.jit
    def products(x, w):  # the loop index scales x, so the product cannot be hoisted out of the loop
        # The decoder's product on a CPU (float32 accumulation, result in the compute dtype); `w` is packed
        # (cpu_matmul) where a decode packs it.
        columns = w.out_shape[0] if isinstance(w, cpu_matmul.PackedWeight) else w.shape[1]

        def product(x):
            return cpu_forms.FORMS.product("ri,io->ro", x, w, x.dtype).astype(x.dtype)

        return jax.lax.fori_loop(0, calls, lambda i, acc: acc + product(x * i.astype(x.dtype)),
                                 jnp.zeros((x.shape[0], columns), x.dtype))

    c = config
    shapes = [
        ("q projection", (c.hidden_size, c.num_heads * c.head_dim), c.num_layers),
        ("k and v projections", (c.hidden_size, c.num_kv_heads * c.head_dim), 2 * c.num_layers),
        ("output projection", (c.num_heads * c.head_dim, c.hidden_size), c.num_layers),
        ("MLP gate and up", (c.hidden_size, c.intermediate_size), 2 * c.num_layers),
        ("MLP down", (c.intermediate_size, c.hidden_size), c.num_layers),
        ("unembedding", (c.hidden_size, c.vocab_size), 1),
    ]
    out = []
    for name, (fan_in, fan_out), count in shapes:
        x = jax.random.normal(jax.random.key(0), (rows, fan_in), dtype)
        w = jax.random.normal(jax.random.key(1), (fan_in, fan_out), dtype)
        if cpu_matmul.use_for(dtype, None):
            w = cpu_matmul.pack(w[None], 1)  # once per decode call, outside the loop
        jax.block_until_ready(products(x, w))
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(products(x, w))
            samples.append((time.perf_counter() - start) / calls)
        out.append((name, (fan_in, fan_out), count, statistics.median(samples)))
    return out


def floor(model, repeats: int, decode_step: float | None, theirs_per_token: float | None) -> None:
    rows = PROMPTS * SAMPLES
    products = weight_products(model.config, rows, max(repeats, 5), jnp.dtype(DTYPE))
    total = sum(count * seconds for _, _, count, seconds in products)
    kernel = "cpu_matmul, packed weights" if cpu_matmul.use_for(DTYPE, None) else "XLA"
    print(f"\n### Floor: the weight products of one decode step (batch {rows}, {DTYPE}, {kernel}, warm caches)\n")
    print("| weight product | shape | per step | ms each | GFLOP/s | ms per step |")
    print("|---|---|---|---|---|---|")
    for name, (fan_in, fan_out), count, seconds in products:
        rate = 2 * rows * fan_in * fan_out / seconds / 1e9
        print(f"| {name} | [{rows},{fan_in}]x[{fan_in},{fan_out}] | {count} | {seconds * 1e3:.3f} | {rate:.0f} | "
              f"{count * seconds * 1e3:.1f} |")
    print(f"| **all weight products of a decode step** | | | | | **{total * 1e3:.1f}** |")
    if decode_step is not None:
        print(f"| measured decode step (capacity 256, above) | | | | | {decode_step * 1e3:.1f} |")
    if theirs_per_token is not None:
        print(f"| transformers: generation time per token of a row (throughput, above) | | | | | {theirs_per_token * 1e3:.1f} |")
        print(f"| **3x transformers: the time per token it allows** | | | | | **{theirs_per_token / 3 * 1e3:.1f}** |")
        print(f"| **best ratio with these weight products alone (no attention, no sampling)** | | | | | "
              f"**{theirs_per_token / total:.2f}x** |")


def main() -> None:
    global NEW_TOKENS, DTYPE, TORCH_DTYPE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-torch", action="store_true", help="measure jaxgrpo only")
    parser.add_argument("--only", choices=("throughput", "capacity", "floor"), default=None)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="fewer for a quick indicative run")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=DTYPE, help="weights and compute, both sides")
    parser.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default=None,
                        help="transformers' dtype, if not --dtype (e.g. its fastest against our bfloat16)")
    args = parser.parse_args()
    NEW_TOKENS, DTYPE, TORCH_DTYPE = args.new_tokens, args.dtype, args.torch_dtype
    model, tokenizer = jaxgrpo.models.load("smollm2-135m-instruct", dtype=jnp.dtype(DTYPE))
    theirs_per_token = decode_step = None
    if args.only in (None, "throughput"):
        theirs_per_token = throughput(model, tokenizer, args.repeats, args.skip_torch)
    if args.only in (None, "capacity"):
        decode_step = capacity(model, tokenizer, args.repeats)
    if args.only in (None, "floor"):
        floor(model, args.repeats, decode_step, theirs_per_token)


if __name__ == "__main__":
    main()
