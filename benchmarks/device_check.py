"""One command that measures what matters on the accelerator it runs on, into one JSON file.

    python benchmarks/device_check.py [--out benchmarks/results/device_check_<chip>.json] [--small]
        [--model qwen3-0.6b] [--prompts 16] [--samples 8] [--prompt-len 256] [--new-tokens 512]
        [--steps 3] [--micro-batch 16] [--sections env,matmul,attention,sampler,decode_loop,train,torch]
        [--decode-variants engine,engine-unshared,engine-graphs,engine-no-split-k,engine-graphs-no-split-k]
        [--trace-dir DIR]
        [--train-runs packing_on,packing_off,packing_off_float32_products,packing_on_one_step_off]

Everything runs on random weights of a published architecture (`jaxgrpo.models.architectures`, Qwen3-0.6B
by default) in bfloat16, from a checkout with only the core install and the platform's jax; nothing is
downloaded. The sections, each written to the JSON as soon as it is measured (a run cut short keeps what
it measured):

* `env`: the chip, its memory, jax and jaxlib versions, the platform;
* `matmul`: the measured bfloat16 matmul peak (a jitted N x N x N product, median of repeats) and the
  measured memory bandwidth (a jitted elementwise pass over a large array: bytes read + written);
* `attention`: forward + backward of one layer's training attention on the packed prompt-group layout
  (one prompt and its samples in a row) and on unpacked rows, for every implementation that runs here;
* `sampler`: prompts x samples rows through the rollout engine as the trainer samples (one slot per row, the
  completion in one decode chunk), `--prompt-len` random prompt tokens, `--new-tokens` new tokens, no stop
  token: tokens/s and ms per decode step (the slope between a short and the full run, so prefill is out of
  it) beside the HBM floor (the weights plus the live KV cache read once a step, the prompt's blocks once per
  group as the engine shares them, over the measured bandwidth);
* `decode_loop`: the same through the engine's decode variants side by side (`--decode-variants`): "engine", as
  jaxgrpo runs it (the backend chooses: on a GPU the paged kernel reads the pool in place); "engine-unshared",
  without shared prefixes (each row reads its prompt's blocks itself); "engine-graphs", its decode chunk
  compiled with XLA command buffers for WHILE and CONDITIONAL (CUDA graphs on a GPU); "engine-no-split-k", with no
  GEMM split over its contraction (`NO_SPLIT_K`); "engine-graphs-no-split-k", both (`DECODE_VARIANTS` has more:
  "engine-stacked-writes-each" is a GPU's decode as it was before 2026-12-07, the stacked layer weights scanned, the
  pool written one position at a time; "engine-merged-outside" has XLA merge the attention's states, not the
  paged kernel); where "engine" fails, "engine-merged-outside" and then "engine-views" run in its place until one
  runs; with `--trace-dir`, a jax.profiler trace of one short run of the engine, the device's busy share of it and
  what it ran per new token (kernels launched, their time, the idle gaps between them, the costliest kernels);
* `train`: the trainer's GRPO step (`Trainer.step`: sample, score, update) on a task whose reward is
  the parity of each completion's token sum (so every group has signal), packing on and off, the layers
  rematerialized whole, not at all or keeping what a remat policy names (`_remat_off`, `_save_attention`,
  `_save_projections`), scanned or one after another (`_unrolled`), the products returning bfloat16 or, as before
  2026-12-07, float32 (`_float32_products`: `float32_products`), synchronous or one-step-off (`--train-runs`;
  `_one_step_off`: `max_staleness=1` on the one device, the next step's sampling, rewards included, overlapping the
  update; its step time beside the synchronous run's of the same packing as `step_speedup_over_sync`): seconds per
  step and per update, update tokens/s and MFU (6 N x the update's tokens, N the parameters a token multiplies by:
  `compile.update_model_flops`; prompt + completion slots of every row as `jaxgrpo-compile` counts them, over the
  matmul peak measured here), with the compile report's roofline estimate of the same update
  (`compile.count_products` at the measured peak and bandwidth) and the measured/estimate factor, and each step's
  `logp_gap` (the sampler's log-probs against the trainer's before the update: the engine's paged kernel against
  the training attention, a check of their values on this chip; `logp_gap_max` the largest); a run that
  fails inside the rollout engine its steps sample through is run again with the engine as the decode section's
  fallbacks decode (`train_with_engine_fallbacks`), and names the one that ran (`engine_fallback`);
* `torch`: the same shapes through transformers + torch, each in its own process, when torch sees this
  accelerator (or with `--small` on a CPU): `generate`, and forward + backward + AdamW over the step's rows
  in micro-batches of 32 with gradient checkpointing: the anchor (`generate` where the sampler or the decode loop
  runs too, the training step where the train runs do, both where neither does; their ratios are written beside
  the figures they anchor: `speedup_over_torch_generate`, `speedup_over_torch`). They run first, before this
  process's jax claims the accelerator's memory.

`--small` runs all of it on a tiny Qwen3-shaped model in seconds (on a CPU): a test runs it so the script
cannot rot. Without `--small` the defaults are the shapes of the issue that asked for this (16 prompts x 8
samples, 256-token prompts, 512 new tokens).

Results written before 2026-12-06 time `sampler.generate`'s fixed batch (since removed) in `sampler` and in every
decode variant but "engine" and "engine-views" (those were the rollout engine already).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

SECTIONS = ("env", "matmul", "attention", "sampler", "decode_loop", "train", "torch")

#: A Qwen3-shaped model small enough for a CPU to run every section in seconds (`--small`).
SMALL_HF_CONFIG = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "rope_scaling": None, "max_position_embeddings": 4096, "sliding_window": None, "use_sliding_window": False,
    "tie_word_embeddings": True,
}
SMALL_SHAPES = {"prompts": 2, "samples": 4, "prompt_len": 16, "new_tokens": 16, "steps": 2, "micro_batch": 4}
#: The shapes of the issue that asked for this script (without `--small`).
FULL_SHAPES = {"prompts": 16, "samples": 8, "prompt_len": 256, "new_tokens": 512, "steps": 3, "micro_batch": 16}


@dataclasses.dataclass(frozen=True)
class Shapes:
    prompts: int
    samples: int
    prompt_len: int
    new_tokens: int
    steps: int
    micro_batch: int

    @property
    def rows(self) -> int:
        return self.prompts * self.samples


# -- a tokenizer and task for random weights --------------------------------------------------------------


class IdTokenizer:
    """Text is token ids written as decimal numbers ("17 4 99"): any id a random model samples decodes, and a
    prompt of n numbers is n tokens. No special tokens, so nothing stops a completion early."""

    pad_token_id = 0
    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False, **_):
        text = " ".join(m["content"] for m in messages if m["role"] == "user")
        return self.encode(text) if tokenize else text


@dataclasses.dataclass
class RandomPromptsTask:
    """Prompts of `length` random token ids; the reward is the parity of a completion's token sum."""

    vocab_size: int = 512
    length: int = 16
    name: str = "device_check"

    def load(self, split: str, *, data_dir: str | None = None, num_examples: int | None = None) -> list[dict]:
        rng = np.random.default_rng([0, split == "train"])
        ids = rng.integers(1, self.vocab_size, (num_examples or 256, self.length))
        return [{"question": " ".join(map(str, row)), "answer": ""} for row in ids]

    def messages(self, example: dict) -> list[dict]:
        return [{"role": "user", "content": example["question"]}]

    def default_rewards(self) -> list:
        return [(parity_reward, 1.0)]

    def reference_completion(self, example: dict) -> str:
        return "0"


def parity_reward(completions: list[str], examples) -> np.ndarray:
    """1 where the completion's token ids sum to an even number: about half of every group."""
    return np.array([float(sum(map(int, c.split())) % 2 == 0) for c in completions], np.float32)


# -- measurements -----------------------------------------------------------------------------------------


def timed(fn, *args, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of `fn(*args)` after one warm-up call (the compile)."""
    import jax

    jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return seconds


def environment() -> dict:
    import jax
    import jaxlib

    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {"chip": device.device_kind, "platform": device.platform, "device_count": jax.device_count(),
            "memory_bytes": stats.get("bytes_limit"), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "python": platform.python_version(), "host": platform.node(), "processor": _cpu_name()}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def matmul_and_bandwidth(small: bool) -> dict:
    """The bfloat16 matmul peak (FLOP/s) and the memory bandwidth (bytes/s), measured: medians of repeats."""
    import jax
    import jax.numpy as jnp

    n = 512 if small else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.bfloat16))
    seconds = timed(matmul, a, b, repeats=5 if small else 20)
    peak = 2.0 * n**3 / statistics.median(seconds)
    elements = (1 << 20) if small else (1 << 30)  # 2 GiB of bfloat16 read and written on an accelerator
    x = jnp.ones((elements,), jnp.bfloat16)
    scale = jax.jit(lambda x: x * jnp.bfloat16(1.0001))
    seconds_bw = timed(scale, x, repeats=5 if small else 20)
    bandwidth = 2 * elements * 2 / statistics.median(seconds_bw)
    return {"matmul_n": n, "matmul_seconds": seconds, "peak_flops": peak, "bandwidth_bytes": 2 * elements * 2,
            "bandwidth_seconds": seconds_bw, "bandwidth": bandwidth}


def attention_layouts(shapes: Shapes, config) -> dict:
    """Forward + backward seconds of one layer's training attention over one micro-batch, packed (one prompt
    and its samples per row, as `jaxgrpo.models.packing` lays them out) and unpacked, for every implementation
    that runs here, with each one's largest difference from the XLA reference (output and gradients); on a GPU
    also cuDNN's fused attention (`jax.nn.dot_product_attention`) on the unpacked rows, for scale."""
    import jax
    import jax.numpy as jnp

    from jaxgrpo.models import attention

    platform_name = jax.default_backend()
    kv, groups, head_dim = config.num_kv_heads, config.num_heads // config.num_kv_heads, config.head_dim
    completion, prompt, samples = shapes.new_tokens, shapes.prompt_len, shapes.samples
    packed_rows, rows = shapes.micro_batch // samples, shapes.micro_batch
    packed_length = prompt + samples * completion
    slots = jnp.arange(packed_length, dtype=jnp.int32)
    branch = jnp.where(slots < prompt, 0, 1 + (slots - prompt) // completion)
    positions = jnp.where(branch == 0, slots, prompt + (slots - prompt) % completion)
    layouts = {
        "packed": (attention.AttentionLayout.branches(jnp.ones((packed_rows, packed_length), jnp.int32),
                                                      jnp.broadcast_to(branch, (packed_rows, packed_length))),
                   jnp.broadcast_to(positions, (packed_rows, packed_length))),
        "unpacked": (attention.AttentionLayout.padded(jnp.ones((rows, prompt + completion), bool)),
                     jnp.broadcast_to(jnp.arange(prompt + completion, dtype=jnp.int32), (rows, prompt + completion))),
    }
    scale = head_dim**-0.5
    results = {}

    def inputs(rows, length):
        key = jax.random.key(0)
        return (jax.random.normal(key, (rows, length, kv, groups, head_dim), jnp.bfloat16),
                jax.random.normal(jax.random.fold_in(key, 1), (rows, length, kv, head_dim), jnp.bfloat16),
                jax.random.normal(jax.random.fold_in(key, 2), (rows, length, kv, head_dim), jnp.bfloat16))

    def gradient(implementation, layout, positions):
        def loss(q, k, v):
            out = implementation.attend(q, k, v, implementation.prepare(layout, positions, None), False, scale=scale)
            return jnp.sum(out.astype(jnp.float32) ** 2), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    def record(name, fn, args, reference=None):
        try:
            seconds = timed(fn, *args, repeats=3 if shapes.prompts <= 2 else 10)
            entry = {"seconds": statistics.median(seconds), "seconds_all": seconds}
            if reference is not None:
                (_, out), grads = fn(*args)
                (_, ref_out), ref_grads = reference
                # max |ours - reference| / max |reference|, per output and gradient
                entry["relative_difference_from_xla"] = {
                    part: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                                / jnp.maximum(jnp.max(jnp.abs(b.astype(jnp.float32))), 1e-30))
                    for part, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref_grads))}
        except Exception as error:  # noqa: BLE001 — e.g. out of memory: recorded, the others still run
            entry = {"error": _one_line(error)}
        results[name] = {"shape": [int(d) for d in args[0].shape], **entry}
        print(f"  attention {name}: {results[name]}", flush=True)

    # On a CPU the Pallas kernels run interpreted (their parity tests cover them): the compiled forms only.
    names = [n for n in attention.available(platform_name) if platform_name != "cpu" or n in ("xla", "cpu")]
    for layout_name, (layout, positions) in layouts.items():
        args = inputs(*positions.shape)
        reference = None
        for name in sorted(names, key=lambda n: n != "xla"):  # the reference first
            fn = gradient(attention.get(name), layout, positions)
            if name == "xla":
                try:
                    reference = jax.block_until_ready(fn(*args))
                except Exception:  # noqa: BLE001 — no reference where the dense form does not fit
                    reference = None
            record(f"{name}/{layout_name}", fn, args, None if name == "xla" else reference)
    if platform_name == "gpu":
        q, k, v = inputs(rows, prompt + completion)

        def cudnn_loss(q, k, v):
            b, t = q.shape[:2]
            out = jax.nn.dot_product_attention(q.reshape(b, t, kv * groups, head_dim), k, v, scale=scale,
                                               is_causal=True, implementation="cudnn")
            return jnp.sum(out.astype(jnp.float32) ** 2), out.reshape(q.shape)
        record("cudnn/unpacked", jax.jit(jax.value_and_grad(cudnn_loss, argnums=(0, 1, 2), has_aux=True)), (q, k, v))
    return results


def _prompts(model, shapes: Shapes) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return rng.integers(1, model.config.vocab_size, (shapes.prompts, shapes.prompt_len)).tolist()


def through_engine(model, shapes: Shapes, in_place: bool | None = None):
    """`generate(new_tokens, seed)` -> completion tokens made, through the rollout engine (one slot per row,
    the whole completion in one decode chunk), as the trainer samples; `in_place`: the
    engine's choice of reading the pool's blocks in place (None: the backend's, the paged kernel on a GPU;
    False: through dense views gathered once a chunk)."""
    import jax

    from jaxgrpo import engine as engine_lib
    from jaxgrpo import sampler

    prompts = _prompts(model, shapes)
    engine = engine_lib.Engine(model, num_slots=shapes.rows,
                               max_context=sampler.bucket_length(shapes.prompt_len) + shapes.new_tokens,
                               decode_chunk=shapes.new_tokens, in_place=in_place)
    params = sampler.SamplingParams(temperature=1.0)

    def generate(new_tokens: int, seed: int) -> int:
        out = engine_lib.generate_groups(engine, prompts, num_samples=shapes.samples, max_new_tokens=new_tokens,
                                         sampling=params, key=jax.random.key(seed))
        return int(out.completion_mask.sum())

    return generate


def sampler_section(model, shapes: Shapes, bandwidth: float, generate=None) -> dict:
    """Tokens/s and ms per decode step of `generate` (`through_engine`'s by default), beside the HBM floor
    per step."""
    import jax

    generate = generate or through_engine(model, shapes)

    def run(new_tokens: int, seed: int) -> float:
        start = time.perf_counter()
        made = generate(new_tokens, seed)
        elapsed = time.perf_counter() - start
        assert made == shapes.rows * new_tokens, f"rows stopped early: {made} of {shapes.rows * new_tokens} tokens"
        return elapsed

    short = max(shapes.new_tokens // 8, 2)
    run(short, 0), run(shapes.new_tokens, 0)  # compile both buckets
    # A decode step's time is the difference of a long and a short generate over their step counts: the fastest
    # of three runs each (a shared machine's noise only adds time), measured again while noise outweighs it.
    for _ in range(3):
        full = [run(shapes.new_tokens, seed) for seed in (1, 2, 3)]
        brief = [run(short, seed) for seed in (1, 2, 3)]
        per_step = (min(full) - min(brief)) / (shapes.new_tokens - short)
        if per_step > 0:
            break
    else:
        raise RuntimeError(f"a decode step's time is lost in noise ({short} and {shapes.new_tokens} new tokens "
                           "took as long): time more --new-tokens")
    c = model.config
    kv_bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2  # k and v, bfloat16
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx_state(model)))
    # Live cache at the middle step: every prompt's blocks once (shared by its samples), each row's new tokens.
    live = (shapes.prompts * shapes.prompt_len + shapes.rows * shapes.new_tokens / 2) * kv_bytes_per_token
    floor = (weights + live) / bandwidth
    return {"new_tokens": shapes.new_tokens, "short_new_tokens": short, "seconds_all": full, "short_seconds_all": brief,
            "seconds": statistics.median(full), "tokens_per_second": shapes.rows * shapes.new_tokens / statistics.median(full),
            "ms_per_decode_step": 1e3 * per_step, "weight_bytes": int(weights), "mean_live_kv_bytes": int(live),
            "hbm_floor_ms_per_step": 1e3 * floor, "floor_ratio": per_step / floor}


@dataclasses.dataclass(frozen=True)
class DecodeVariant:
    """How the engine decodes: `in_place`, whether it reads the pool's blocks in place (None: the backend's choice;
    `through_engine`'s, and within `decode_variant` every engine's, the trainer's too); `options`, XLA compiler
    options its decode chunks are compiled with (only XLA:GPU reads these); `stacked`, a GPU's decode runs on the
    plain memory forms instead of the GPU's (`memory_forms.GPU`): it scans the stacked layer weights instead of
    splitting them per layer before the loop (`memory_forms.split_layers`), and rotates RoPE's halves by a
    concatenate (`memory_forms.rotate_half`, not `swap_halves`);
    `writes_each`, a GPU's paged decode writes its new positions one at a time instead of with a scatter
    (`AttentionImplementation.paged_writes_each`). The last two are the decode as it was before 2026-12-07.
    `shared_prefixes` False: each row reads its prompt's blocks itself, instead of the samples of a prompt reading
    them once as a shared prefix (`Engine._chunk_rows`): one paged kernel call a layer instead of two, each row's
    whole context read (a GPU's L2 may serve the repeats). `merged_in_kernel` False: the decoder merges the paged
    kernel's states and normalizes them itself (`AttentionImplementation.paged_attention` off)."""

    in_place: bool | None = None
    options: tuple[tuple[str, object], ...] = ()
    stacked: bool = False
    writes_each: bool = False
    shared_prefixes: bool = True
    merged_in_kernel: bool = True


#: XLA command buffers with WHILE and CONDITIONAL nodes: a decode chunk's whole `lax.while_loop` as CUDA graphs.
GRAPH_OPTIONS = {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"}

#: XLA:GPU splits a small-M GEMM over its contraction (split-K: float32 partial sums, reduced by its consumers).
#: Compiled for an H100 (`benchmarks/gpu_programs.py`, its heuristics standing in for the autotuner), a decode step's
#: QKV and MLP products are split so, and each consumer (the q and k norms, the pool's scatter, the MLP's activation)
#: reads and reduces the float32 partial sums itself: 2.03 GB a step outside the GEMMs, 0.77 GB without the split
#: (434 operations instead of 476). The autotuner times a GEMM alone, not the reads its split adds to its consumers.
NO_SPLIT_K = {"xla_gpu_experimental_force_split_k": 1}

#: The engine's decode variants the `decode_loop` section can time side by side: "engine" as jaxgrpo runs it (the
#: backend chooses: on a GPU its paged kernel reads the pool in place, the layers' weights split per layer before
#: the loop), "engine-views" through dense views gathered once a chunk (the form the paged kernel replaces),
#: "engine-graphs" its decode chunks compiled with `GRAPH_OPTIONS`, "engine-no-split-k" with `NO_SPLIT_K`
#: ("engine-graphs-no-split-k" with both), "engine-stacked" scanning the stacked layer weights, and
#: "engine-stacked-writes-each" also writing the pool one position at a time (a GPU's decode before 2026-12-07:
#: `benchmarks/gpu_programs.py` counts what each launches); "engine-unshared" with no shared prefixes (each row reads
#: its whole context); "engine-merged-outside" with the attention's states merged and normalized by XLA, not in the
#: paged kernel (`AttentionImplementation.paged_attention` off: the decode before the late evening of 2026-12-07).
DECODE_VARIANTS = {"engine": DecodeVariant(), "engine-views": DecodeVariant(in_place=False),
                   "engine-graphs": DecodeVariant(options=tuple(GRAPH_OPTIONS.items())),
                   "engine-stacked": DecodeVariant(stacked=True),
                   "engine-stacked-writes-each": DecodeVariant(stacked=True, writes_each=True),
                   "engine-unshared": DecodeVariant(shared_prefixes=False),
                   "engine-merged-outside": DecodeVariant(merged_in_kernel=False),
                   "engine-no-split-k": DecodeVariant(options=tuple(NO_SPLIT_K.items())),
                   "engine-graphs-no-split-k": DecodeVariant(options=tuple({**GRAPH_OPTIONS, **NO_SPLIT_K}.items()))}
#: The variants `--decode-variants` times unless told.
DEFAULT_DECODE_VARIANTS = ("engine", "engine-unshared", "engine-graphs", "engine-no-split-k",
                           "engine-graphs-no-split-k")
#: Where "engine" fails (a kernel Triton does not compile on this GPU, say), these run after the asked variants,
#: each only where the one before failed too: the paged kernel without the merges it takes in, then no paged kernel.
FALLBACK_DECODE_VARIANTS = ("engine-merged-outside", "engine-views")


@contextlib.contextmanager
def decode_variant(variant: DecodeVariant):
    """Within it, the engine's decode chunks are the library's decode program (`programs.engine_decode`, the same
    static and donated arguments) jitted anew (so nothing traced before is reused), with the variant's compiler
    options, memory forms, pool writes, shared prefixes, merges and (for every engine built, the trainer's too)
    reading in place or not; its prefill and block copies are the library's."""
    import jax

    import jaxgrpo.engine.engine as engine_module
    from jaxgrpo.engine import programs
    from jaxgrpo.models import memory_forms
    from jaxgrpo.models.attention import pallas_gpu

    saved = (engine_module.decode_program, memory_forms.GPU, pallas_gpu.IMPLEMENTATION,
             engine_module.Engine._chunk_rows, engine_module.reads_pages_in_place)
    engine_module.decode_program = jax.jit(
        programs.engine_decode, static_argnames=("graphdef", "width", "steps", "samplings", "mesh", "prefix_width",
                                                 "in_place"),
        donate_argnames=("cache",), compiler_options=dict(variant.options) or None)
    if variant.stacked:
        memory_forms.GPU = memory_forms.PLAIN._replace(name="gpu")
    if variant.writes_each:
        pallas_gpu.IMPLEMENTATION = pallas_gpu.IMPLEMENTATION._replace(paged_writes_each=True)
    if not variant.shared_prefixes:
        engine_module.Engine._chunk_rows = lambda self, running: (running, None, 0)
    if not variant.merged_in_kernel:
        pallas_gpu.IMPLEMENTATION = pallas_gpu.IMPLEMENTATION._replace(paged_attention=None)
    if variant.in_place is not None:
        engine_module.reads_pages_in_place = lambda model, mesh: variant.in_place
    try:
        yield
    finally:
        (engine_module.decode_program, memory_forms.GPU, pallas_gpu.IMPLEMENTATION, engine_module.Engine._chunk_rows,
         engine_module.reads_pages_in_place) = saved


def decode_section(model, shapes: Shapes, bandwidth: float, trace_dir: str | None,
                   variants=tuple(DECODE_VARIANTS)) -> dict:
    """`sampler_section` for each of `variants` (of `DECODE_VARIANTS`), then, where "engine" failed, the first of
    `FALLBACK_DECODE_VARIANTS` that runs; and a jax.profiler trace of one short run of the engine as jaxgrpo runs
    it: the device's busy share of its wall time. A variant or trace that fails is recorded, the rest kept."""
    result = {}

    def timed(name):
        variant = DECODE_VARIANTS[name]
        with decode_variant(variant) if variant != DecodeVariant() else contextlib.nullcontext():
            try:
                generate = through_engine(model, shapes, variant.in_place)
                result[name] = sampler_section(model, shapes, bandwidth, generate)
            except Exception as error:  # noqa: BLE001 — recorded; the other variants still run
                traceback.print_exc()
                result[name] = {"error": _one_line(error)}
        print(f"  decode loop {name}: {result[name]}", flush=True)
        return "error" not in result[name]

    for name in variants:
        timed(name)
    if "error" in result.get("engine", {}):
        for name in FALLBACK_DECODE_VARIANTS:
            if (name in result and "error" not in result[name]) or (name not in result and timed(name)):
                break
    if trace_dir:
        try:
            result["profile"] = _decode_profile(model, shapes, trace_dir)
        except Exception as error:  # noqa: BLE001 — the variants' figures above are kept
            traceback.print_exc()
            result["profile"] = {"error": _one_line(error)}
        print(f"  decode loop profile: {result['profile']}", flush=True)
    return result


def train_with_engine_fallbacks(run, fallbacks: list) -> dict:
    """`run()`'s result, with the step's rollout engine as `fallbacks[0]` decodes (None: as jaxgrpo runs it, else
    a variant of `FALLBACK_DECODE_VARIANTS`). Where it fails inside the engine (a paged kernel Triton does not
    compile on this GPU, say), the next fallbacks are tried in turn; the first that runs is kept in `fallbacks[0]`
    for the runs after it and named in the result (`engine_fallback`). A failure elsewhere, or in every form of the
    engine, is recorded in one line."""
    while True:
        try:
            with decode_variant(DECODE_VARIANTS[fallbacks[0]]) if fallbacks[0] else contextlib.nullcontext():
                entry = run()
            return entry | ({"engine_fallback": fallbacks[0]} if fallbacks[0] else {})
        except Exception as error:  # noqa: BLE001 — recorded; the other sections still run
            traceback.print_exc()
            in_engine = "jaxgrpo/engine/" in "".join(traceback.format_tb(error.__traceback__))
            if not in_engine or len(fallbacks) == 1:
                return {"error": _one_line(error)}
            fallbacks.pop(0)
            print(f"  the step's rollout engine failed; trying it as {fallbacks[0]}", flush=True)


def _decode_profile(model, shapes: Shapes, trace_dir: str) -> dict:
    """A jax.profiler trace of one short run of the engine as jaxgrpo runs it: the device's busy share of it and
    what it ran per new token (`profiling.device_kernels`: launches, kernel time, idle gaps, the costliest
    kernels; the prefill spread over the tokens). The trace's files are also copied to `trace_dir` itself (the
    profiler writes them four folders down), so a tool that returns shallow files brings them back."""
    import shutil

    import jax

    from jaxgrpo import profiling

    generate = through_engine(model, shapes)
    short = max(shapes.new_tokens // 8, 2)
    generate(short, 0)  # compiled (or compiles) outside the trace
    with jax.profiler.trace(trace_dir):
        start = time.perf_counter()
        generate(short, 1)
        wall = time.perf_counter() - start
    kernels = profiling.device_kernels(trace_dir, count=short)
    busy = None if kernels is None else kernels["busy_ms_per_step"] * short / 1e3
    for pattern in ("*.xplane.pb", "*.trace.json.gz"):
        for path in glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", pattern)):
            shutil.copy(path, trace_dir)
    return {"new_tokens": short, "wall_seconds": wall, "device_busy_seconds": busy,
            "device_busy_share": None if busy is None else busy / wall, "per_new_token": kernels,
            "trace_dir": trace_dir}


def nnx_state(model):
    from flax import nnx

    return nnx.state(model, nnx.Param)


#: The train runs' remat settings (`--train-runs` suffixes, `_remat_suffix`): the default (the layers
#: recomputed whole), none, and the policies that keep more (`Config.remat_policy`).
REMAT_RUNS = (True, False, "save_attention", "save_projections")


def _remat_suffix(remat: bool | str) -> str:
    return "" if remat is True else "_remat_off" if remat is False else f"_{remat}"


def run_name(packing: bool, remat: bool | str = True, scan_layers: bool = True, float32: bool = False,
             max_staleness: int = 0, attention: str = "") -> str:
    """A train run's name, as `--train-runs` takes it and the JSON keys it: packing_on or packing_off, then
    `_<attention>` where it is not the run's default, then the suffixes of its settings in their order."""
    return (f"packing_{'on' if packing else 'off'}" + (f"_{attention}" if attention else "") + _remat_suffix(remat)
            + ("" if scan_layers else "_unrolled") + ("_float32_products" if float32 else "")
            + ("_one_step_off" if max_staleness else ""))


@contextlib.contextmanager
def float32_products(enabled: bool = True):
    """Within it (when `enabled`), the accelerators' memory forms return their products in float32
    (`memory_forms.float32_product`) instead of the model's dtype, as before 2026-12-07: the backward pass's
    products then multiply float32 cotangents, a float32 GEMM each (`memory_forms.product_in_dtype`)."""
    from jaxgrpo.models import memory_forms

    saved = memory_forms.PLAIN, memory_forms.GPU
    if enabled:
        memory_forms.PLAIN, memory_forms.GPU = (forms._replace(product=memory_forms.float32_product) for forms in saved)
    try:
        yield
    finally:
        memory_forms.PLAIN, memory_forms.GPU = saved


def train_config(model_name: str, shapes: Shapes, packing: bool, attention: str, remat: bool | str = True,
                 max_staleness: int = 0, scan_layers: bool = True):
    """The trainer's config for a train run; `remat`: False, True ("full") or a policy of `Config.remat_policy`;
    `scan_layers`: `Config.scan_layers`."""
    from jaxgrpo.config import Config

    c = Config()
    c.model = model_name
    c.dtype = "bfloat16"
    c.remat = bool(remat)
    c.remat_policy = remat if isinstance(remat, str) else "full"
    c.scan_layers = scan_layers
    c.packing = packing
    c.attention = attention
    c.task.name = "device_check"
    c.task.num_eval_examples = 0
    c.correctness_reward = "parity_reward"
    c.advantage, c.loss, c.aggregation = "grpo", "ppo_clip", "seq_mean_token_mean"
    c.kl_coef = 0.0
    c.prompts_per_step, c.group_size = shapes.prompts, shapes.samples
    c.micro_batch_size = shapes.micro_batch
    c.sampling.max_prompt_len = shapes.prompt_len
    c.sampling.max_new_tokens = shapes.new_tokens
    c.sampling.temperature = 1.0
    c.optimizer.lr = 1e-6
    c.steps = shapes.steps
    c.eval_every = 0
    c.checkpoint_every = 0
    c.max_steps_without_signal = 0
    c.collapse_window = 0
    c.max_staleness = max_staleness
    return c


def update_estimate(cfg, mesh, peak: float, bandwidth: float) -> dict:
    """The compile report's roofline of one update call (`compile.count_products` at the measured peak and
    bandwidth), times the calls a step makes."""
    from jaxgrpo.tools import compile as compile_lib

    abstract = compile_lib.abstract_train_state(cfg, mesh)
    _, tokens, jaxpr = compile_lib.lower_update(cfg, mesh, abstract)
    products = compile_lib.count_products(jaxpr, peak, bandwidth)
    calls = cfg.num_minibatches * cfg.num_epochs
    return {"estimate_seconds": products.roofline_seconds * calls,
            "estimate_with_memory_seconds": products.with_memory_seconds * calls, "tokens": tokens * calls,
            "num_params": abstract.num_params, "model_flops": compile_lib.update_model_flops(abstract, tokens * calls),
            "loops_counted_once": products.loops_counted_once}


def train_section(model_name: str, shapes: Shapes, packing: bool, attention: str, peak: float, bandwidth: float,
                  remat: bool | str = True, max_staleness: int = 0, scan_layers: bool = True,
                  float32: bool = False) -> dict:
    """Seconds of the GRPO step (`Trainer.step`: sample, score, update; the first step compiles, the
    ones after it are timed) and of its update alone (`Trainer.update` repeated on one step's batch: the
    median), with MFU and the compile report's estimate of the same update; `float32`: within
    `float32_products`."""
    with float32_products(float32):
        return _train_section(model_name, shapes, packing, attention, peak, bandwidth, remat, max_staleness,
                              scan_layers) | {"float32_products": float32}


def _train_section(model_name: str, shapes: Shapes, packing: bool, attention: str, peak: float, bandwidth: float,
                   remat: bool | str, max_staleness: int, scan_layers: bool) -> dict:
    import jax

    from jaxgrpo.distributed import gather_rows
    from jaxgrpo.train import Trainer
    from jaxgrpo.train.rollout import row_stats

    cfg = train_config(model_name, shapes, packing, attention, remat, max_staleness, scan_layers)
    trainer = Trainer(cfg)
    steps = []
    for step in range(shapes.steps):
        start = time.perf_counter()
        trainer.loop_state, metrics = trainer.step(trainer.loop_state)
        jax.block_until_ready(trainer.state)
        steps.append({"step_seconds": time.perf_counter() - start, "update_seconds": metrics["time_train"],
                      "frac_signal_rows": metrics.get("frac_signal_rows"), "logp_gap": metrics.get("logp_gap")})
        print(f"  train packing={packing} step {step}: {steps[-1]}", flush=True)
    rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(cfg.seed + 1))
    batch = trainer.advantages(trainer.loop_state, rollout, gather_rows(row_stats(rollout)))
    updates, train = [], trainer.state
    for _ in range(3):
        start = time.perf_counter()
        train, _ = trainer.update(train, batch)
        jax.block_until_ready(train)
        updates.append(time.perf_counter() - start)
    print(f"  train packing={packing} updates: {updates}", flush=True)
    estimate = update_estimate(cfg, trainer.mesh, peak, bandwidth)
    update = statistics.median(updates)
    step = statistics.median(r["step_seconds"] for r in (steps[1:] or steps))
    gaps = [r["logp_gap"] for r in steps if r["logp_gap"] is not None]
    model_flops = estimate["model_flops"]
    completion_tokens = shapes.rows * shapes.new_tokens
    return {"packing": packing, "remat": remat, "scan_layers": scan_layers, "max_staleness": max_staleness,
            "attention": trainer.policy.decoder.attention_implementation(trainer.mesh).name,
            "steps": steps, "step_seconds": step, "logp_gap_max": max(gaps) if gaps else None,
            "update_seconds_all": updates, "update_seconds": update,
            "update_tokens": estimate["tokens"], "update_tokens_per_second": estimate["tokens"] / update,
            "completion_tokens_per_second": completion_tokens / update,
            "seconds_per_completion_token": update / completion_tokens,
            "mfu": model_flops / update / peak, "num_params": estimate["num_params"],
            "estimate_seconds": estimate["estimate_seconds"],
            "measured_over_estimate": update / estimate["estimate_seconds"],
            "estimate_with_memory_seconds": estimate["estimate_with_memory_seconds"],
            "measured_over_estimate_with_memory": update / estimate["estimate_with_memory_seconds"]}


# -- the torch anchor, in its own process -------------------------------------------------------------------


def torch_anchor(kind: str, hf_config: dict, shapes: Shapes) -> dict:
    """transformers + torch on the same shapes (random weights, bfloat16): `generate` or a training step."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in hf_config.items() if k not in ("model_type", "architectures")},
                                  model_type=hf_config["model_type"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    prompts = torch.randint(1, config.vocab_size, (shapes.prompts, shapes.prompt_len), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if kind == "generate":
        def run(new_tokens):
            sync()
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0, top_k=0,
                               num_return_sequences=shapes.samples, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, pad_token_id=0)
            sync()
            return time.perf_counter() - start
        run(max(shapes.new_tokens // 8, 4))  # warm-up (on a GPU the first long call was 3x slower than the next)
        seconds = [run(shapes.new_tokens) for _ in range(2)]
        return {"device": device, "seconds_all": seconds,
                "tokens_per_second": shapes.rows * shapes.new_tokens / statistics.median(seconds)}
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows = torch.cat([prompts.repeat_interleave(shapes.samples, 0),
                      torch.randint(1, config.vocab_size, (shapes.rows, shapes.new_tokens), device=device)], 1)
    micro = min(32, shapes.rows)

    def step():
        sync()
        start = time.perf_counter()
        for i in range(0, shapes.rows, micro):
            batch = rows[i:i + micro]
            logits = model(batch).logits[:, shapes.prompt_len - 1:-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     batch[:, shapes.prompt_len:].reshape(-1))
            (loss * batch.shape[0] / shapes.rows).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    step()
    seconds = [step() for _ in range(3)]
    tokens = shapes.rows * (shapes.prompt_len + shapes.new_tokens)
    return {"device": device, "micro_batch": micro, "gradient_checkpointing": True, "seconds_all": seconds,
            "seconds": statistics.median(seconds), "tokens_per_second": tokens / statistics.median(seconds),
            "completion_tokens_per_second": shapes.rows * shapes.new_tokens / statistics.median(seconds)}


def anchor_kinds(sections) -> tuple[str, ...]:
    """The torch anchors a run with `sections` compares against: `generate` beside the sampler and the decode
    loop, the training step beside the train runs; both where it runs neither (the torch section alone)."""
    kinds = tuple(kind for kind, beside in (("generate", {"sampler", "decode_loop"}), ("update", {"train"}))
                  if beside & set(sections))
    return kinds or ("generate", "update")


def torch_section(hf_config: dict, shapes: Shapes, small: bool, kinds=("generate", "update")) -> dict:
    """Each anchor of `kinds` in a separate process (so torch and jax never share the accelerator's memory)."""
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not (torch.cuda.is_available() or small):
        return {"skipped": "torch does not see an accelerator"}
    results = {}
    for kind in kinds:
        spec = json.dumps({"kind": kind, "hf_config": hf_config, "shapes": dataclasses.asdict(shapes)})
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--anchor", spec], capture_output=True,
                              text=True, timeout=900)
        if proc.returncode:
            results[kind] = {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1]}
        else:
            results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  torch {kind}: {results[kind]}", flush=True)
    return results


# -- the driver ---------------------------------------------------------------------------------------------


def with_ratios(result: dict) -> dict:
    """`result` (a device check's JSON) with the ratios that compare its figures, written into their entries:
    each decode figure's tokens/s over transformers' `generate` (`speedup_over_torch_generate`), each train run's
    update over the torch training step (`speedup_over_torch`), a one-step-off run's step over the synchronous
    run's of the same packing (`step_speedup_over_sync`)."""
    generate = result.get("torch", {}).get("generate", {})
    for entry in [result.get("sampler", {}), *result.get("decode_loop", {}).values()]:
        if "tokens_per_second" in generate and "tokens_per_second" in entry:
            entry["speedup_over_torch_generate"] = entry["tokens_per_second"] / generate["tokens_per_second"]
    anchor = result.get("torch", {}).get("update", {})
    runs = result.get("train", {})
    for key, run in runs.items():
        if "seconds" in anchor and "update_seconds" in run:
            run["speedup_over_torch"] = anchor["seconds"] / run["update_seconds"]
        sync = runs.get(key.removesuffix("_one_step_off"), {})
        if key.endswith("_one_step_off") and "step_seconds" in run and "step_seconds" in sync:
            run["step_speedup_over_sync"] = sync["step_seconds"] / run["step_seconds"]
    return result


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def register(hf_config: dict, shapes: Shapes, name: str) -> None:
    """The random-weights model and the parity task under names a `Config` can give."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxgrpo.data import register_task, task_names
    from jaxgrpo.models import Decoder
    from jaxgrpo.models.config import from_hf_config
    from jaxgrpo.train import register_model_builder

    config = from_hf_config(hf_config)
    vocab_size = config.vocab_size

    def build(dtype=jnp.bfloat16, remat: bool = True):
        return (Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)),
                IdTokenizer(config.vocab_size))

    register_model_builder(name, build)
    if "device_check" not in task_names():
        register_task("device_check", lambda config=None, **_: RandomPromptsTask(vocab_size, shapes.prompt_len))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="the JSON file (default benchmarks/results/device_check_<chip>.json)")
    parser.add_argument("--small", action="store_true", help="a tiny model and shapes: every section in seconds on a CPU")
    parser.add_argument("--model", default="qwen3-0.6b", help="an architecture of jaxgrpo.models.architectures")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--attention", default="auto", help="the trainer's attention implementation")
    parser.add_argument("--compare-xla", action="store_true",
                        help="also train packed with the XLA attention (on an accelerator), for a before/after")
    parser.add_argument("--train-runs", default="packing_on,packing_off",
                        help="comma-separated train runs, each packing_on or packing_off, with _remat_off to keep the "
                             "layers' activations instead of recomputing them (more memory, less compute) or "
                             "_save_attention or _save_projections for that remat policy (Config.remat_policy), "
                             "_unrolled for scan_layers=false, _float32_products for the products in float32 (as "
                             "before 2026-12-07), and/or _one_step_off for max_staleness=1 (in that order)")
    parser.add_argument("--decode-variants", default=",".join(DEFAULT_DECODE_VARIANTS),
                        help=f"comma-separated, of {', '.join(DECODE_VARIANTS)}")
    parser.add_argument("--trace-dir", default=None,
                        help="the decode_loop section writes a jax.profiler trace of one short run of the engine here")
    for field in dataclasses.fields(Shapes):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--anchor", default=None, help=argparse.SUPPRESS)  # the torch anchor's child process
    args = parser.parse_args(argv)
    if args.anchor:
        spec = json.loads(args.anchor)
        print(json.dumps(torch_anchor(spec["kind"], spec["hf_config"], Shapes(**spec["shapes"]))))
        return {}
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    train_runs = []
    known = {run_name(p, r, s, f, o): (p, r, o, s, f) for p in (True, False) for r in REMAT_RUNS
             for s in (True, False) for f in (False, True) for o in (0, 1)}
    for run in (r.strip() for r in args.train_runs.split(",") if r.strip()):
        if run not in known:
            parser.error(f"unknown train run {run!r}: write packing_on or packing_off, optionally with "
                         f"{', '.join(_remat_suffix(r) for r in REMAT_RUNS[1:])}, _unrolled, _float32_products "
                         "and/or _one_step_off (in that order)")
        train_runs.append(known[run])
    variants = tuple(v.strip() for v in args.decode_variants.split(",") if v.strip())
    unknown = sorted(set(variants) - set(DECODE_VARIANTS))
    if unknown:
        parser.error(f"unknown decode variant(s) {', '.join(unknown)}; choose from {', '.join(DECODE_VARIANTS)}")

    from jaxgrpo.models import architectures

    if args.small:
        hf_config, defaults = SMALL_HF_CONFIG, SMALL_SHAPES
    else:
        if args.model not in architectures.ARCHITECTURES:
            parser.error(f"unknown --model {args.model!r}; choose one of {', '.join(architectures.names())}")
        hf_config = dict(architectures.ARCHITECTURES[args.model].hf_config)
        defaults = FULL_SHAPES
    shapes = Shapes(**{k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()})
    if shapes.micro_batch % shapes.samples:
        parser.error(f"--micro-batch {shapes.micro_batch} must hold whole groups of --samples {shapes.samples} "
                     "(packing scores a group at once)")

    import jax

    from jaxgrpo.models import attention as attention_lib
    from jaxgrpo.models.config import from_hf_config

    model_name = "random-" + ("small" if args.small else args.model)
    register(hf_config, shapes, model_name)
    # The torch anchors first, before this process's jax claims the accelerator's memory (XLA preallocates
    # most of it on a GPU, and the anchor's training step then runs out).
    anchor_start = time.perf_counter()
    anchor = None
    if "torch" in sections:
        try:
            anchor = torch_section(hf_config, shapes, args.small, anchor_kinds(sections))
        except Exception as error:  # noqa: BLE001 — recorded; the other sections still run
            anchor = {"error": _one_line(error)}
    anchor_seconds = time.perf_counter() - anchor_start
    env = environment()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"device_check_{env['chip'].lower().replace(' ', '_')}.json")
    result = {"benchmark": "device_check", "model": model_name, "small": args.small, "shapes": dataclasses.asdict(shapes),
              "date": time.strftime("%Y-%m-%d"), "env": env}

    def save():
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)

    save()
    print(f"device check on {env['chip']} ({env['platform']}), jax {env['jax']}: {out}", flush=True)

    def section(name, fn, *fn_args):
        start = time.perf_counter()
        try:
            result[name] = fn(*fn_args)
        except Exception as error:  # noqa: BLE001 — one section's failure is recorded, the others still run
            traceback.print_exc()
            result[name] = {"error": _one_line(error)}
        result.setdefault("section_seconds", {})[name] = time.perf_counter() - start
        save()
        return result[name]

    peak = bandwidth = None
    if "matmul" in sections:
        measured = section("matmul", matmul_and_bandwidth, args.small)
        peak, bandwidth = measured.get("peak_flops"), measured.get("bandwidth")
        if peak:
            print(f"  bfloat16 matmul {peak / 1e12:.1f} TFLOP/s, bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    peak, bandwidth = peak or 1e12, bandwidth or 1e11  # without a measurement the ratios are not meaningful
    config = from_hf_config(hf_config)
    if "attention" in sections:
        section("attention", attention_layouts, shapes, config)

    engine_fallbacks = [None, *FALLBACK_DECODE_VARIANTS]  # the first is the engine as jaxgrpo runs it

    def train(packing: bool, attention_name: str, remat: bool | str = True, max_staleness: int = 0,
              scan_layers: bool = True, float32: bool = False) -> None:
        key = run_name(packing, remat, scan_layers, float32, max_staleness,
                       "" if attention_name == trained_attention else attention_name)
        run = functools.partial(train_section, model_name, shapes, packing, attention_name, peak, bandwidth, remat,
                                max_staleness, scan_layers, float32)
        result.setdefault("train", {})[key] = train_with_engine_fallbacks(run, engine_fallbacks)
        save()

    trained_attention = args.attention
    default = attention_lib.default_for(jax.default_backend())
    if args.attention == "auto" and "error" in result.get("attention", {}).get(f"{default}/packed", {}):
        trained_attention = "xla"  # the default kernel failed here: train with the reference, and say so
        result["attention_fallback"] = f"{default} failed in the attention section; the train runs used xla"
    if "sampler" in sections or "decode_loop" in sections:
        from jaxgrpo.train.state import MODEL_BUILDERS

        model, _ = MODEL_BUILDERS[model_name](dtype=jax.numpy.bfloat16, remat=False)
        if "sampler" in sections:
            section("sampler", sampler_section, model, shapes, bandwidth)
        if "decode_loop" in sections:
            section("decode_loop", decode_section, model, shapes, bandwidth, args.trace_dir, variants)
        del model
    if "train" in sections:
        for packing, remat, max_staleness, scan_layers, float32 in train_runs:
            train(packing, trained_attention, remat, max_staleness, scan_layers, float32)
    if anchor is not None:
        result["torch"] = anchor
        result.setdefault("section_seconds", {})["torch"] = anchor_seconds
        save()
    if "train" in sections and args.compare_xla and jax.default_backend() != "cpu" and trained_attention != "xla":
        train(True, "xla")  # the dense attention the packed layout used before: a before/after in one run
    with_ratios(result)
    save()
    print(json.dumps({k: v for k, v in result.items() if k in ("matmul", "sampler", "decode_loop", "train", "torch")}, indent=1,
                     default=str)[:6000], flush=True)
    return result


if __name__ == "__main__":
    main()
