"""`engine.generate` (an `Engine` made for the call) on tiny random decoders of every family: cached greedy
decoding equals argmax of full forwards, log-probs equal the trainer's recomputation, determinism, stop tokens,
sharding; and the engine's compiled programs: the pool donated, no whole-cache copy in the decode loop, bfloat16
weights read in place."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import engine, sampler
from jaxgrpo.engine import groups, programs
from jaxgrpo.models import Decoder, DecoderConfig, cpu_matmul
from jaxgrpo.models.partitioning import shard_model
from tests.support.references import greedy_without_cache

_SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, head_dim=16)
CONFIGS = {
    "llama": DecoderConfig(family="llama", num_kv_heads=2, **_SMALL),
    "qwen2": DecoderConfig(family="qwen2", num_kv_heads=2, qkv_bias=True, **_SMALL),
    "qwen3": DecoderConfig(family="qwen3", num_kv_heads=2, qk_norm=True, **_SMALL),
    "gemma3": DecoderConfig(
        family="gemma3", num_kv_heads=1, layer_types=("sliding_attention", "full_attention"), sliding_window=4,
        qk_norm=True, query_pre_attn_scalar=16, final_logit_softcapping=5.0, tie_word_embeddings=True, **_SMALL,
    ),
}
# Three prompts of different lengths (all in the 16-token bucket), two samples each.
PROMPTS = [[3, 17, 42, 8, 91], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [60, 2, 33]]
NEW_TOKENS = 12


@functools.lru_cache(maxsize=None)
def random_model(family: str) -> Decoder:
    model = Decoder(CONFIGS[family], rngs=nnx.Rngs(0))

    # Norm weights start at their identity values; perturb them so every code path matters. Scale the
    # embeddings up so greedy decoding is far from ties.
    def perturb(path, value):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return value + 0.3 * jax.random.normal(jax.random.key(value.size), value.shape)
        return value * 5.0 if "embed" in name or "lm_head" in name else value

    nnx.update(model, jax.tree_util.tree_map_with_path(perturb, nnx.state(model, nnx.Param)))
    return model


def greedy_reference(family: str, prompts, new_tokens: int) -> np.ndarray:
    """Step-by-step argmax of full forwards of `random_model(family)` without a cache: int [B, new_tokens]."""
    return greedy_without_cache(random_model(family), prompts, new_tokens)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_generation_equals_argmax_of_full_forwards(family):
    rollout = engine.generate(random_model(family), PROMPTS, num_samples=2, max_new_tokens=NEW_TOKENS, greedy=True)
    expected = greedy_reference(family, PROMPTS, NEW_TOKENS)
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), np.repeat(expected, 2, axis=0))
    assert rollout.completion_tokens.shape == (6, NEW_TOKENS)
    assert np.asarray(rollout.completion_mask).all()
    assert (np.asarray(rollout.finish_reason) == sampler.FINISH_LENGTH).all()
    assert np.asarray(rollout.prompt_index).tolist() == [0, 0, 1, 1, 2, 2]
    # The prompts actually used: left-padded to the 16-token bucket.
    assert rollout.prompt_tokens.shape == (6, 16)
    assert np.asarray(rollout.prompt_tokens[1]).tolist() == [0] * 11 + PROMPTS[0]
    assert np.asarray(rollout.prompt_tokens[2, -11:]).tolist() == PROMPTS[1]
    assert np.asarray(rollout.prompt_mask).sum(axis=1).tolist() == [5, 5, 11, 11, 3, 3]


def _recomputed_logprobs(model, rollout, temperature):
    """What the trainer computes (the model's chunked log-probs) on the full sequences, and full logits."""
    sequences = jnp.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1)
    mask = jnp.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1)
    targets = jnp.roll(sequences, -1, axis=1)  # the last column's target is never used
    logprobs, _ = model.token_logprobs(sequences, targets, attention_mask=mask, temperature=temperature,
                                       sequence_chunk=8, vocab_chunk=32)
    prompt_length = rollout.prompt_tokens.shape[1]
    full_logits = model(sequences, attention_mask=mask)[:, prompt_length - 1:-1]
    return logprobs[:, prompt_length - 1:-1], full_logits


@pytest.mark.parametrize("family, truncation", [("gemma3", {}), ("llama", dict(top_k=20, top_p=0.95))])
def test_sampler_logprobs_equal_the_trainers_recomputation(family, truncation):
    model = random_model(family)
    temperature = 0.7
    rollout = engine.generate(model, PROMPTS, num_samples=2, max_new_tokens=NEW_TOKENS, key=jax.random.key(0),
                               temperature=temperature, stop_tokens=[1, 2, 3], **truncation)
    recomputed, logits = jax.jit(_recomputed_logprobs, static_argnums=2)(model, rollout, temperature)
    mask = np.asarray(rollout.completion_mask)
    assert mask.sum() > 20
    np.testing.assert_allclose(np.where(mask, recomputed, 0.0), rollout.policy_logprobs, atol=1e-5)
    # The sampling log-probs: under the truncated, renormalized distribution the token was drawn from.
    params = sampler.SamplingParams(temperature=temperature, **truncation)
    sampling = jnp.take_along_axis(sampler.sampling_log_probs(logits, params), rollout.completion_tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.where(mask, sampling, 0.0), rollout.logprobs, atol=1e-5)
    if not truncation:
        np.testing.assert_allclose(rollout.logprobs, rollout.policy_logprobs, atol=1e-6)
    else:
        assert (np.asarray(rollout.logprobs) >= np.asarray(rollout.policy_logprobs) - 1e-6).all()


def _sampled(prompts, key=0, **kwargs):
    kwargs.setdefault("num_samples", 2)
    return engine.generate(random_model("llama"), prompts, max_new_tokens=NEW_TOKENS, key=jax.random.key(key),
                            temperature=0.7, top_k=20, top_p=0.95, stop_tokens=[1, 2, 3], **kwargs)


def test_same_seed_same_output_and_another_seed_another():
    first, again, other = _sampled(PROMPTS), _sampled(PROMPTS), _sampled(PROMPTS, key=1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(first.completion_tokens), np.asarray(other.completion_tokens))
    # The G samples of a prompt differ from each other.
    assert not np.array_equal(np.asarray(first.completion_tokens[0]), np.asarray(first.completion_tokens[1]))


def test_a_prompts_output_does_not_depend_on_its_companions_or_padding():
    model = random_model("llama")
    reordered = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    # Greedy: companions and their order do not matter, nor does a longer companion that moves the
    # batch to the 32-token bucket (more left padding).
    greedy = engine.generate(model, PROMPTS, num_samples=2, max_new_tokens=NEW_TOKENS, greedy=True)
    shuffled = engine.generate(model, reordered, num_samples=2, max_new_tokens=NEW_TOKENS, greedy=True)
    np.testing.assert_array_equal(np.asarray(greedy.completion_tokens[0]), np.asarray(shuffled.completion_tokens[2]))
    before = engine.compilation_counts()
    padded = engine.generate(model, [list(range(4, 24)), PROMPTS[0], [5]], num_samples=2, max_new_tokens=NEW_TOKENS,
                              greedy=True)
    after = engine.compilation_counts()
    assert padded.prompt_tokens.shape[1] == 32 and greedy.prompt_tokens.shape[1] == 16
    np.testing.assert_array_equal(np.asarray(greedy.completion_tokens[0]), np.asarray(padded.completion_tokens[2]))
    # The new bucket (a larger pool) compiled each program once.
    assert {name: after[name] - before.get(name, 0) for name in after} == {"forward": 1, "decode": 1, "copy": 1}
    # Sampling: with the same prompt ids, each prompt's samples are the same in any batch order.
    sampled = _sampled(PROMPTS, prompt_ids=[10, 11, 12])
    resampled = _sampled(reordered, prompt_ids=[12, 10, 11])
    for rows, other_rows in ((slice(0, 2), slice(2, 4)), (slice(2, 4), slice(4, 6)), (slice(4, 6), slice(0, 2))):
        np.testing.assert_array_equal(np.asarray(sampled.completion_tokens[rows]), np.asarray(resampled.completion_tokens[other_rows]))
        np.testing.assert_allclose(sampled.logprobs[rows], resampled.logprobs[other_rows], atol=1e-5)


def test_lengths_in_the_same_bucket_do_not_recompile():
    _sampled(PROMPTS)
    before = engine.compilation_counts()
    _sampled([[9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [1], [4, 4]], key=5)  # 16 tokens: same bucket
    engine.generate(random_model("llama"), PROMPTS, num_samples=2, max_new_tokens=9, key=jax.random.key(0),
                     temperature=0.7, top_k=20, top_p=0.95, stop_tokens=[4])  # 9 new tokens, other stops
    assert engine.compilation_counts() == before


def test_stop_tokens_end_rows_with_reason_mask_and_padding():
    model = random_model("llama")
    expected = greedy_reference("llama", PROMPTS, NEW_TOKENS)
    # Stop on the 5th greedy token of prompt 0 (a token it has not produced before).
    stop = int(next(t for i, t in enumerate(expected[0]) if i >= 4 and t not in expected[0][:i]))
    rollout = engine.generate(model, PROMPTS, num_samples=2, max_new_tokens=NEW_TOKENS, greedy=True,
                               stop_tokens=[stop], pad_id=0)
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    reasons = np.asarray(rollout.finish_reason)
    for row in range(6):
        reference = expected[row // 2]
        hits = np.flatnonzero(reference == stop)
        length = hits[0] + 1 if hits.size else NEW_TOKENS
        assert mask[row].sum() == length and mask[row, :length].all()
        np.testing.assert_array_equal(tokens[row, :length], reference[:length])
        assert (tokens[row, length:] == 0).all()
        assert (np.asarray(rollout.logprobs)[row, length:] == 0).all()
        assert reasons[row] == (sampler.FINISH_STOP if hits.size else sampler.FINISH_LENGTH)
    assert reasons[0] == sampler.FINISH_STOP


def _hlo_arrays(hlo: str):
    """(name, element type, element count, opcode) of every instruction of a compiled program's text."""
    for match in re.finditer(r"%(\S+) = (\w+)\[([\d,]*)\]\{[^}]*\} ([\w-]+)\(", hlo):
        name, element_type, dims, opcode = match.groups()
        yield name, element_type, math.prod(int(d) for d in dims.split(",") if d), opcode


def _computations(hlo: str) -> dict[str, str]:
    """A compiled program's computations by name (the entry's as "ENTRY")."""
    out = {}
    for computation in re.split(r"\n(?=(?:ENTRY )?%\S+ \()", hlo):
        name = re.match(r"(ENTRY )?%(\S+) \(", computation)
        if name:
            out["ENTRY" if name.group(1) else name.group(2)] = computation
    return out


def _unfused_arrays(hlo: str, skip=()):
    """`_hlo_arrays` of the instructions that make buffers: those of the computations that no fusion calls (less
    the computations named in `skip`)."""
    fused = set(re.findall(r"fusion\([^\n]*?calls=%([\w.\-]+)", hlo))
    for name, computation in _computations(hlo).items():
        if name not in fused and name not in skip:
            yield from _hlo_arrays(computation)


# Six slots over 4-position blocks of a 17-block pool. Three layers, two kv heads and an MLP width of 80 give the
# pool, a decode chunk's dense view and the weights element counts that no other array of the programs shares.
_DISTINCT_SIZES = dict(num_layers=3, layer_types=("full_attention",) * 3, num_kv_heads=2, intermediate_size=80)
_SLOTS, _BLOCKS, _BLOCK, _WIDTH = 6, 17, 4, 16


def _whole_sizes() -> tuple[int, int]:
    """Element counts of the programs' pool (k or v) and of a decode chunk's dense view, at the sizes above."""
    config = dataclasses.replace(CONFIGS["llama"], **_DISTINCT_SIZES)
    per_layer = config.num_layers * config.num_kv_heads * config.head_dim
    return per_layer * _BLOCKS * _BLOCK, per_layer * _SLOTS * (_WIDTH + NEW_TOKENS)


def _model(dtype=jnp.float32, family="llama", **config_changes):
    if dtype == jnp.float32 and not config_changes:
        return random_model(family)
    return Decoder(dataclasses.replace(CONFIGS[family], **config_changes), dtype=dtype, param_dtype=dtype,
                   rngs=nnx.Rngs(0))


@functools.lru_cache(maxsize=None)
def _compiled(dtype, family, program):
    """The parameters and compiled HLO text of the engine's "engine prefill" or "engine decode" program (its dense
    views: the form every backend without a paged kernel runs), traced as `jaxgrpo-compile` traces them."""
    graphdef, state = nnx.split(_model(dtype, family, **_DISTINCT_SIZES))
    traced = programs.trace_programs(graphdef, state, num_slots=_SLOTS, num_blocks=_BLOCKS, block_size=_BLOCK,
                                     max_context=32, prefill_rows=3, prompt_len=16, draws=_SLOTS, width=_WIDTH,
                                     steps=NEW_TOKENS, sampling=sampler.SamplingParams(greedy=True))
    return state, traced[program].lower().compile().as_text()


def test_the_engines_programs_take_the_pool_donated_and_write_only_the_blocks_in_use():
    model = _model()
    pool = engine.Engine(model, num_slots=_SLOTS, max_context=32, block_size=_BLOCK, num_blocks=_BLOCKS)
    requests = [engine.Request(id=i, prompt=p, max_new_tokens=NEW_TOKENS, sampling=sampler.SamplingParams(greedy=True))
                for i, p in enumerate(PROMPTS)]
    before = pool.cache
    pool.prefill(requests)
    assert before.k.is_deleted() and before.v.is_deleted()  # donated: its buffers were reused
    before = pool.cache
    pool.decode()
    assert before.k.is_deleted() and before.v.is_deleted()
    held = sorted({b for s in pool._sequences.values() for b in s.blocks})
    free = [b for b in range(1, _BLOCKS) if b not in held]
    k = np.asarray(pool.cache.k)
    assert all(k[:, b].any() for b in held)
    assert not k[:, free].any()  # the blocks no sequence holds were never written


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_the_engines_decode_loop_never_copies_the_pool_or_the_view(dtype):
    # The cost of a decode step must not grow with the pool or the chunk's dense view beyond attention reading it:
    # inside the decode loop no instruction makes a whole pool or view (in any layout, of any element type) except
    # in place: the loop carries the view (a bfloat16 view as its bits, the CPU memory forms' to_carry) and updates
    # it with dynamic-update-slice. The view is gathered from the blocks once before the loop and written back once
    # after it (the program's entry computation).
    whole = set(_whole_sizes())
    _, hlo = _compiled(dtype, "llama", "engine decode")
    in_place = ("parameter", "get-tuple-element", "bitcast", "tuple", "while", "dynamic-update-slice")
    inside = [(name, opcode) for name, _, size, opcode in _unfused_arrays(hlo, skip=("ENTRY",)) if size in whole]
    copies = [(name, opcode) for name, opcode in inside if opcode not in in_place and "dynamic-update-slice" not in name]
    assert inside, "the decode loop carries no whole view: the sizes above no longer describe the program"
    assert not copies, f"the decode loop makes a whole pool or view other than in place: {copies[:3]}"


@pytest.mark.parametrize("program", ["engine prefill", "engine decode", "engine copy"])
def test_the_engines_bfloat16_programs_move_the_pool_as_its_bits(program):
    # XLA:CPU gathers and scatters bfloat16 through float32: gathering a chunk's dense view from a bfloat16 pool, or
    # writing new positions into it, converted the whole pool to float32 and back once per call (SmolLM2's pool for
    # 32 slots of 192 positions is 141 MB), and slicing the decode chunk's new columns out of its view converted
    # the whole view. No instruction may hold a whole pool, or a decode chunk's whole view, in float32. And the
    # engine keeps the pool as its bits between programs (`programs.init_pool`): a bfloat16 pool going in and out
    # of each program was converted to its bits and back whole (four copies of it a call, 1% of the sampler
    # benchmark's), so no instruction may hold a whole pool in bfloat16 either.
    pool_size, view_size = _whole_sizes()
    whole = {pool_size, view_size}
    if program == "engine copy":  # copy-on-write of the blocks that hold a prompt's partial last block
        config = dataclasses.replace(CONFIGS["llama"], **_DISTINCT_SIZES)
        pool = jax.eval_shape(lambda: programs.init_pool(config, _BLOCKS, _BLOCK, jnp.bfloat16))
        assert pool.k.dtype == jnp.uint16 and pool.v.dtype == jnp.uint16
        ids = jax.ShapeDtypeStruct((16,), jnp.int32)
        hlo = programs.copy_program.lower(pool, ids, ids, mesh=None).compile().as_text()
    else:
        _, hlo = _compiled(jnp.bfloat16, "llama", program)
    converted = [(name, opcode) for name, element_type, size, opcode in _hlo_arrays(hlo)
                 if element_type == "f32" and size in whole]
    assert not converted, f"the {program} program holds a whole pool or view in float32: {converted[:3]}"
    recast = [(name, opcode) for name, element_type, size, opcode in _hlo_arrays(hlo)
              if element_type == "bf16" and size == pool_size]
    assert not recast, f"the {program} program converts the whole pool out of its bits: {recast[:3]}"


# The decode's weight products: packed for the C++ kernel on this CPU (cpu_matmul, where it is built), or
# XLA's products, as on accelerators and on CPUs without AVX512-BF16.
PROGRAMS = ["engine prefill", "engine decode", "engine decode-xla-products"]


@pytest.fixture
def products_of(monkeypatch):
    """products_of(program): patches the decoder to XLA's products for "engine decode-xla-products"; returns the
    engine program to compile."""
    patched = []

    def choose(program):
        if program == "engine decode" and not cpu_matmul.available():
            pytest.skip("cpu_matmul needs a C++ compiler and an AVX512-BF16 CPU")
        if program == "engine decode-xla-products":
            monkeypatch.setattr(cpu_matmul, "use_for", lambda *args: False)
            jax.clear_caches()  # the programs traced with the kernel must not be reused
            patched.append(program)
            return "engine decode"
        return program
    yield choose
    if patched:
        jax.clear_caches()  # nor these, after the patch is undone


def _bfloat16_program(family, program):
    """`_compiled` in bfloat16, compiled afresh for the XLA products (the patch changes what is traced)."""
    if program == "engine decode-xla-products":
        return _compiled.__wrapped__(jnp.bfloat16, family, "engine decode")
    return _compiled(jnp.bfloat16, family, program)


def _weight_sizes(state, family):
    """Element counts of the layers' matrices, stacked and one layer's, the embedding and any output projection."""
    vocab = CONFIGS[family].vocab_size
    weights = [x for x in jax.tree.leaves(state) if x.ndim >= 3 or vocab in x.shape]
    return {x.size for x in weights} | {x[0].size for x in weights if x.ndim >= 3}


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])  # separate and tied (embedding) output weights
def test_the_engines_bfloat16_programs_never_convert_the_weights(family, program, products_of):
    # XLA:CPU slices, gathers and transposes bfloat16 arrays in float32: without reading the layers' weights
    # and the embedding through their bits, it converts every weight stack to float32 once per call and
    # runs every product in float32. The weights' products take bfloat16 operands, accumulate in float32.
    products_of(program)
    state, hlo = _bfloat16_program(family, program)
    sizes = _weight_sizes(state, family)
    converted = [(name, opcode) for name, element_type, size, opcode in _hlo_arrays(hlo)
                 if element_type == "f32" and size in sizes]
    assert not converted, f"the {program} program holds a weight in float32: {converted[:3]}"
    if program == "engine decode":
        # q, k, v, o, gate, up, down in the layer loop and the unembedding: the kernel, on bfloat16 bits.
        calls = re.findall(r"custom-call\([^\n]*custom_call_target=\"jaxgrpo_cpu_matmul\", "
                           r"operand_layout_constraints=\{(u16)\[[^\n]*u16\[", hlo)
        assert len(calls) == 8, calls
        return
    # Every product (each is a fused computation here) multiplies bfloat16 operands.
    products = [m.group(1) for m in re.finditer(r"\n%\S+ \(([^)]*)\) -> \S+ \{\n(?:  .*\n)*?  .* dot\(", hlo)]
    assert len(products) >= 7, products  # q, k, v, o, gate, up, down, unembedding, attention
    assert all("f32" not in operands for operands in products), [p for p in products if "f32" in p][:3]


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_engines_bfloat16_programs_read_the_weights_in_place(family, program, products_of):
    # A bitcast hoisted out of the layer or decode loop makes XLA:CPU write every weight's bits to a new
    # buffer once per call (and a transposed copy of a tied embedding): for SmolLM2, 270 MB of freshly
    # faulted pages per engine call. No instruction may make a whole weight, in any element type or layout,
    # except the kernel's packing: once per decode call, before the loop (the program's entry computation).
    products_of(program)
    state, hlo = _bfloat16_program(family, program)
    vocab = CONFIGS[family].vocab_size
    sizes = {x.size for x in jax.tree.leaves(state) if x.ndim >= 3 or vocab in x.shape}
    passed_through = ("parameter", "get-tuple-element", "bitcast", "tuple", "while", "opt-barrier")
    copies = _unfused_arrays(hlo, skip=("ENTRY",) if program == "engine decode" else ())
    copies = [(name, opcode) for name, _, size, opcode in copies if size in sizes and opcode not in passed_through]
    assert not copies, f"the {program} program copies a whole weight: {copies[:3]}"


def test_sharded_generation_equals_unsharded(mesh_2x4, monkeypatch):
    model = random_model("llama")
    expected = _sampled(PROMPTS)
    sharded_model = shard_model(nnx.clone(model), mesh_2x4)
    made = []
    monkeypatch.setattr(groups, "Engine", lambda *args, **kwargs: made.append(engine.Engine(*args, **kwargs)) or made[-1])
    rollout = engine.generate(sharded_model, PROMPTS, num_samples=2, max_new_tokens=NEW_TOKENS, key=jax.random.key(0),
                               temperature=0.7, top_k=20, top_p=0.95, stop_tokens=[1, 2, 3])
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), np.asarray(expected.completion_tokens))
    np.testing.assert_allclose(rollout.logprobs, expected.logprobs, atol=1e-5)
    # The engine made for the call sits on the parameters' mesh: its slots split over the data axis.
    assert made[0].mesh == mesh_2x4 and made[0].num_shards == 2 and made[0].num_slots == 6


@pytest.mark.parametrize(
    "prompts, kwargs, argument",
    [
        ([[1, 2, 3]], dict(num_samples=0), "num_samples"),
        ([[1, 2, 3]], dict(top_p=1.2), "top_p"),
        ([[1, 2, 3]], dict(top_p=0.0), "top_p"),
        ([[1, 2], []], dict(), r"prompts\[1\] is empty"),
        ([list(range(1, 40))], dict(context_window=32), "context_window"),
        ([[1, 2, 3]], dict(max_new_tokens=0), "max_new_tokens"),
        ([[1, 200]], dict(), r"prompts\[0\] has token ids outside"),
    ],
)
def test_bad_input_raises_errors_naming_the_argument(prompts, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        engine.generate(random_model("llama"), prompts, key=jax.random.key(0), **kwargs)


def test_the_models_context_window_is_checked_by_default():
    model = Decoder(dataclasses.replace(CONFIGS["llama"], max_position_embeddings=32), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="context_window"):
        engine.generate(model, [list(range(1, 40))], key=jax.random.key(0))


def test_sampling_without_a_key_is_an_error():
    with pytest.raises(ValueError, match="key"):
        engine.generate(random_model("llama"), PROMPTS, temperature=1.0)


def test_a_prompt_whose_completions_would_run_past_the_context_window_is_refused():
    """A row needs len(prompt) + max_new_tokens positions; past the model's window they mean nothing to it."""
    model = Decoder(dataclasses.replace(CONFIGS["llama"], max_position_embeddings=32), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError) as error:
        engine.generate(model, [list(range(1, 21))], key=jax.random.key(0), max_new_tokens=16)
    message = str(error.value)
    assert "prompts[0] has 20 tokens, and with max_new_tokens=16 its row needs 36 positions, more than the model's " \
           "context window of 32" in message and "(to at most 12)" in message, message
    out = engine.generate(model, [list(range(1, 21))], key=jax.random.key(0), max_new_tokens=12)
    assert out.completion_tokens.shape[-1] == 12
