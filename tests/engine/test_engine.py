"""The rollout engine (`jaxgrpo.engine`) on tiny random decoders: greedy tokens the argmax of full forwards,
scheduling-independent sampling, behaviour log-probs the trainer recomputes, `extend` equal to a prefill of
the whole history, block accounting and prefix sharing, and one-line errors that leave other sequences be."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgrpo import sampler
from jaxgrpo.engine import BlockAllocator, Engine, OutOfBlocks, Request, generate, generate_groups
from jaxgrpo.engine import programs as engine_programs
from jaxgrpo.engine.sequences import plan_prefix_rows
from jaxgrpo.errors import ConfigError
from jaxgrpo.models import Decoder
from jaxgrpo.sampler import SamplingParams
from tests.engine.test_generate import NEW_TOKENS, PROMPTS, greedy_reference, random_model

GREEDY = SamplingParams(greedy=True)
SAMPLED = SamplingParams(temperature=0.7)
TRUNCATED = SamplingParams(temperature=0.7, top_k=20, top_p=0.95)


def _requests(prompts, samples=2, *, sampling=GREEDY, budget=NEW_TOKENS, stop=()):
    """G requests per prompt, ids `b * G + g` (the sampler's row order)."""
    return [Request(id=b * samples + g, prompt=p, max_new_tokens=budget, sampling=sampling, stop_tokens=tuple(stop))
            for b, p in enumerate(prompts) for g in range(samples)]


def _engine(family="llama", **kwargs):
    kwargs.setdefault("num_slots", 4)
    kwargs.setdefault("max_context", 64)
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("key", jax.random.key(0))
    return Engine(random_model(family), **kwargs)


def _padded(completions, length=NEW_TOKENS):
    out = np.zeros((len(completions), length), np.int32)
    for row, c in enumerate(completions):
        out[row, :len(c.tokens)] = c.tokens
    return out


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # the families differ to the engine only in sliding windows
def test_greedy_outputs_equal_the_argmax_of_full_forwards(family):
    # 6 requests through 4 slots with 4-position blocks: admission as others finish, prompts spanning
    # partial blocks, Gemma's sliding window over a right-aligned paged view.
    expected = np.repeat(greedy_reference(family, PROMPTS, NEW_TOKENS), 2, axis=0)
    completions = _engine(family).generate(_requests(PROMPTS))
    np.testing.assert_array_equal(_padded(completions), expected)
    assert all(c.finish_reason == "length" and c.sampled.all() for c in completions)


def test_stop_tokens_end_completions_at_the_first_stop():
    expected = greedy_reference("llama", PROMPTS, NEW_TOKENS)
    stop = int(next(t for i, t in enumerate(expected[0]) if i >= 4 and t not in expected[0][:i]))
    completions = _engine(num_slots=2).generate(_requests(PROMPTS, stop=[stop]))
    for row, c in enumerate(completions):
        reference = expected[row // 2]
        hits = np.flatnonzero(reference == stop)
        np.testing.assert_array_equal(c.tokens, reference[:hits[0] + 1 if hits.size else NEW_TOKENS])
        assert c.finish_reason == ("stop" if hits.size else "length")
    assert completions[0].finish_reason == "stop"


@pytest.mark.parametrize("family, sampling", [("llama", SAMPLED), ("llama", TRUNCATED),
                                              ("gemma3", SamplingParams(temperature=0.9, min_p=0.05))],
                         ids=["llama-plain", "llama-top_k_top_p", "gemma3-min_p"])
def test_sampled_groups_do_not_depend_on_the_slots_or_the_blocks(family, sampling):
    # generate_groups counts each request's draws from its completion's start (draw_origin = the prompt's
    # length), so sample g of prompt b draws with the keys of (its prompt id, g) and its index in the completion:
    # the same tokens through 4 slots of 4-position blocks (admission as others finish) as through `generate`'s
    # one slot per row of 16-position blocks, with dataset prompt ids.
    ids = [11, 4, 7]
    expected = generate(random_model(family), PROMPTS, num_samples=3, max_new_tokens=NEW_TOKENS,
                        key=jax.random.key(5), temperature=sampling.temperature, top_k=sampling.top_k,
                        top_p=sampling.top_p, min_p=sampling.min_p, stop_tokens=(1, 2, 3), prompt_ids=ids)
    out = generate_groups(_engine(family), PROMPTS, num_samples=3, max_new_tokens=NEW_TOKENS, sampling=sampling,
                          key=jax.random.key(5), stop_tokens=(1, 2, 3), prompt_ids=ids)
    for name in ("completion_tokens", "completion_mask", "finish_reason", "prompt_tokens", "prompt_index"):
        np.testing.assert_array_equal(np.asarray(getattr(out, name)), np.asarray(getattr(expected, name)), err_msg=name)
    for name in ("logprobs", "policy_logprobs"):
        np.testing.assert_allclose(np.asarray(getattr(out, name)), np.asarray(getattr(expected, name)), atol=1e-5)
    assert len(np.unique(np.asarray(out.completion_tokens), axis=0)) > 3  # the draws differ between samples


def _long_tailed_requests(count, seed=0):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(4, 97, size=rng.integers(2, 14))) for _ in range(count)]
    budgets = np.where(rng.random(count) < 0.8, rng.integers(1, 6, count), 16)
    return [Request(id=int(1000 + i), prompt=p, max_new_tokens=int(b), sampling=TRUNCATED, stop_tokens=(1, 2))
            for i, (p, b) in enumerate(zip(prompts, budgets))]


def test_sampled_tokens_do_not_depend_on_slots_or_admission_order():
    requests = _long_tailed_requests(32)
    runs = {slots: _engine(num_slots=slots, max_context=32).generate(requests) for slots in (4, 16, 64)}
    shuffled = [requests[i] for i in np.random.default_rng(1).permutation(len(requests))]
    reordered = {c.request_id: c for c in _engine(num_slots=16, max_context=32).generate(shuffled)}
    reference = runs[16]
    for other in (runs[4], runs[64], [reordered[r.id] for r in requests]):
        identical = np.mean([np.array_equal(a.tokens, b.tokens) for a, b in zip(reference, other)])
        # Float32 on CPU: the XLA math is batch-invariant here, so every completion agrees.
        assert identical >= 0.99, identical
        for a, b in zip(reference, other):
            if np.array_equal(a.tokens, b.tokens):
                np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # Samples differ between requests of the same prompt (their ids key their draws).
    twins = _engine().generate(_requests([PROMPTS[0]], samples=2, sampling=SAMPLED))
    assert not np.array_equal(twins[0].tokens, twins[1].tokens)


@pytest.mark.parametrize("sampling", [SAMPLED, TRUNCATED, SamplingParams(temperature=0.9, min_p=0.05)],
                         ids=["plain", "top_k_top_p", "min_p"])
def test_behaviour_logprobs_equal_the_trainers_recomputation(sampling):
    model = random_model("llama")
    completions = _engine(num_slots=3).generate(_requests(PROMPTS, sampling=sampling, stop=(1, 2, 3)))
    # The trainer's recomputation on every completion at once (right-padded: causal attention keeps the
    # padding out of every real position).
    width = max(len(c.prompt) + len(c.tokens) for c in completions)
    sequences = np.zeros((len(completions), width), np.int32)
    for row, c in enumerate(completions):
        sequences[row, :len(c.prompt) + len(c.tokens)] = np.concatenate([c.prompt, c.tokens])
    recompute = jax.jit(lambda s: (model.token_logprobs(s, jnp.roll(s, -1, axis=1), temperature=sampling.temperature)[0],
                                   sampler.sampling_log_probs(model(s), sampling)))
    recomputed, behaviour = (np.asarray(x) for x in recompute(jnp.asarray(sequences)))
    checked = 0
    for row, c in enumerate(completions):
        steps = np.arange(len(c.prompt) - 1, len(c.prompt) + len(c.tokens) - 1)
        np.testing.assert_allclose(c.policy_logprobs, recomputed[row, steps], atol=1e-5)
        # The behaviour log-prob: under the truncated distribution the token was drawn from.
        np.testing.assert_allclose(c.logprobs, behaviour[row, steps, c.tokens], atol=1e-5)
        assert (c.versions == 0).all()
        checked += len(c.tokens)
    assert checked > 20


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_extend_after_a_tool_turn_equals_a_prefill_of_the_whole_history(family, sampling):
    engine = _engine(family)
    tool_output = [40, 41, 42, 43, 44, 45, 46]
    (sequence_id,) = engine.prefill([Request(id=7, prompt=PROMPTS[1], max_new_tokens=5, sampling=sampling)])
    first_turn = engine.decode()[sequence_id]
    assert first_turn.finish_reason == "length" and len(first_turn.tokens) == 5
    engine.extend(sequence_id, tool_output, max_new_tokens=6)
    engine.decode()
    extended = engine.release(sequence_id)
    assert extended.sampled.tolist() == [True] * 5 + [False] * 7 + [True] * 6
    assert (extended.versions[~extended.sampled] == -1).all() and (extended.logprobs[~extended.sampled] == 0).all()
    history = PROMPTS[1] + first_turn.tokens.tolist() + tool_output
    (whole,) = _engine(family).generate([Request(id=7, prompt=history, max_new_tokens=6, sampling=sampling)])
    np.testing.assert_array_equal(extended.tokens[12:], whole.tokens)
    np.testing.assert_allclose(extended.logprobs[12:], whole.logprobs, atol=1e-5)
    np.testing.assert_allclose(extended.policy_logprobs[12:], whole.policy_logprobs, atol=1e-5)
    assert engine.blocks_in_use == 0


def test_on_a_mesh_the_slots_and_blocks_split_over_data_and_fsdp_and_the_tokens_do_not_change():
    # 4 x 2 row shards (data x fsdp, as the decoder's activations split rows) of 2 slots: groups of 3 samples split
    # across shards where one has no room, a tool turn extends a sequence on its shard, and every token and
    # log-prob is the single device's.
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:8])
    requests = _requests(PROMPTS, samples=3, sampling=TRUNCATED) + _long_tailed_requests(10)
    sharded, single = _engine(num_slots=16, max_context=32, mesh=mesh), _engine(num_slots=16, max_context=32)
    assert sharded.cache.k.sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"))
    assert sharded.num_shards == 8 and sharded.blocks_per_shard == 2 * 8 + 1
    _assert_same_rollouts_and_tool_turn(sharded, single, requests)
    with pytest.raises(ConfigError, match=r"num_slots=6 does not divide over the mesh's 8 row shards \(data x fsdp\)"):
        _engine(num_slots=6, mesh=mesh)


def _assert_same_rollouts_and_tool_turn(engine, reference, requests):
    """`engine` and `reference` give the same tokens and log-probs for `requests`, and for one sequence's prefill,
    decode, tool turn (`extend`), decode and release; both end with no block in use."""
    for a, b in zip(engine.generate(requests), reference.generate(requests)):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for e in (engine, reference):
        e.prefill([Request(id=1, prompt=PROMPTS[0], max_new_tokens=3, sampling=SAMPLED)])
        e.decode()
        e.extend(1, [40, 41, 42], max_new_tokens=4)
        e.decode()
    a, b = engine.release(1), reference.release(1)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.policy_logprobs, b.policy_logprobs, atol=1e-5)
    assert engine.blocks_in_use == reference.blocks_in_use == 0


def test_samples_of_a_prompt_share_its_full_blocks_and_copy_the_partial_one():
    engine = _engine(num_slots=8, block_size=4)
    prompt = PROMPTS[1]  # 11 tokens: two full blocks and a partial one
    engine.prefill(_requests([prompt], samples=4, budget=1))
    # Alone, 4 samples hold 4 x 3 blocks; shared, the two full blocks once and a partial block each.
    assert engine.blocks_in_use == 2 + 4
    held = [s.blocks for s in engine._sequences.values()]
    assert all(blocks[:2] == held[0][:2] for blocks in held) and len({blocks[2] for blocks in held}) == 4
    assert all(engine.allocators[0].references(b) == 4 for b in held[0][:2])
    completions = engine.decode()
    for sequence_id in list(completions):
        engine.release(sequence_id)
    assert engine.blocks_in_use == 0 and engine.allocators[0].num_free == engine.allocators[0].num_blocks - 1
    # Shared or not, every sample decodes the same tokens (its copy holds the prompt's last positions).
    shared = _engine(num_slots=8).generate(_requests([prompt], samples=4, sampling=SAMPLED))
    alone = [_engine(num_slots=1).generate([r])[0] for r in _requests([prompt], samples=4, sampling=SAMPLED)]
    for a, b in zip(shared, alone):
        np.testing.assert_array_equal(a.tokens, b.tokens)


def test_a_prompt_admitted_later_shares_the_blocks_live_sequences_hold_for_its_leading_tokens():
    engine = _engine(num_slots=4, block_size=4)
    prompt = PROMPTS[1]  # 11 tokens: two full blocks and a partial one
    engine.prefill([Request(id=0, prompt=prompt, max_new_tokens=8)])
    first = list(engine._sequences[0].blocks)
    # The same prompt later: its two full blocks are shared, only its last 3 tokens run (into a block of its own).
    engine.prefill([Request(id=1, prompt=prompt, max_new_tokens=8)])
    assert engine._sequences[1].blocks[:2] == first[:2] and engine.blocks_in_use == 3 + 1
    # Another prompt with the same first 4 tokens shares that block (a system prompt's, say).
    other = prompt[:4] + [60, 61, 62, 63, 64]
    engine.prefill([Request(id=2, prompt=other, max_new_tokens=8)])
    assert engine._sequences[2].blocks[:2] == [first[0], engine._sequences[2].blocks[1]] != first[:2]
    assert engine.blocks_in_use == 4 + 2
    completions = engine.decode()
    for c, alone in zip(completions.values(), (prompt, prompt, other)):
        np.testing.assert_array_equal(c.tokens, _engine(num_slots=1).generate([Request(id=c.request_id, prompt=alone,
                                                                                       max_new_tokens=8)])[0].tokens)
    for sequence_id in (0, 1, 2):
        engine.release(sequence_id)
    # Freed blocks are forgotten: the prompt runs again in full into fresh blocks (which may be the same ids).
    assert engine.blocks_in_use == 0
    engine.prefill([Request(id=3, prompt=prompt, max_new_tokens=8)])
    assert engine.blocks_in_use == 3
    assert engine._prompt_blocks and len(engine._prompt_of_block) == len(engine._prompt_blocks) == 2


def test_decode_reads_a_prompts_shared_blocks_once_and_samples_what_a_view_per_row_samples(monkeypatch):
    """Groups of samples admitted as others finish: each chunk puts a prompt's running samples in rows of a
    shared prefix where they fit (`plan_prefix_rows`); the tokens are those of a dense view per row."""
    rng = np.random.default_rng(2)
    prompts = [list(rng.integers(4, 97, size=rng.integers(5, 14))) for _ in range(10)]
    requests = [Request(id=100 + 4 * b + g, prompt=p, max_new_tokens=int(rng.choice([2, 3, 16])), sampling=TRUNCATED,
                        stop_tokens=(1, 2)) for b, p in enumerate(prompts) for g in range(4)]
    chunks = []
    plan = Engine._chunk_rows

    def recorded(self, running):
        rows, prefixes, width = plan(self, running)
        chunks.append(None if prefixes is None else (int((np.asarray(prefixes.lengths) > 0).sum()), width))
        return rows, prefixes, width

    monkeypatch.setattr(Engine, "_chunk_rows", recorded)
    shared = _engine(num_slots=8, max_context=32).generate(requests)
    used = [c for c in chunks if c is not None]
    assert used and max(n for n, _ in used) == 2  # the two groups admitted first fill the 8 slots
    monkeypatch.setattr(Engine, "_chunk_rows", lambda self, running: (running, None, 0))
    dense = _engine(num_slots=8, max_context=32).generate(requests)
    identical = np.mean([np.array_equal(a.tokens, b.tokens) for a, b in zip(shared, dense)])
    assert identical >= 0.99, identical
    for a, b in zip(shared, dense):
        if np.array_equal(a.tokens, b.tokens):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _running(shard, group, shared):
    return SimpleNamespace(shard=shard, group=group, shared=shared)


def test_a_chunk_gives_the_prompts_with_most_samples_their_own_prefix_rows_while_the_rest_fit():
    a = [_running(0, 1, 8) for _ in range(4)]
    b = [_running(0, 2, 8) for _ in range(3)]
    c = [_running(0, 3, 4)]  # the last running sample of its prompt: it reads its prompt in its own view
    alone = [_running(0, 4, 0), _running(0, 5, 0)]
    # 8 rows in 2 groups of 4: the 4 samples of `a` take one; `b` would leave its 4 others no room.
    assert [(len(m), shared) for m, shared in plan_prefix_rows(a + b + c, 4)] == [(4, True), (4, False)]
    # 16 rows: `a` and `b` each get one; `c` and the rows without a shared prompt fill the next; one is empty.
    plan = plan_prefix_rows(a + [None] + b + c + alone + [None] * 5, 4)
    assert [(m, shared) for m, shared in plan] == [(a, True), (b, True), (alone + c, False), ([], False)]
    # A prompt with more running samples than a group spans groups; every running row is planned once.
    many = [_running(0, 6, 4) for _ in range(6)]
    plan = plan_prefix_rows(many + [None, None], 4)
    assert [(len(m), shared) for m, shared in plan] == [(4, True), (2, True)]


def test_kv_memory_follows_the_live_tokens_at_block_granularity():
    engine = _engine(num_slots=4, block_size=4, decode_chunk=4)
    engine.prefill([Request(id=0, prompt=[5, 6, 7], max_new_tokens=20), Request(id=1, prompt=list(range(4, 13)),
                                                                                max_new_tokens=20)])
    assert engine.blocks_in_use == 1 + 3  # ceil(3 / 4) + ceil(9 / 4)
    engine.decode(max_steps=4)  # each wrote 4 more positions: 7 and 13
    assert engine.blocks_in_use == 2 + 4
    engine.release(0)
    assert engine.blocks_in_use == 4


def test_weights_swap_in_place_and_tokens_carry_the_policy_version():
    engine = _engine(num_slots=2)
    (before,) = engine.generate(_requests([PROMPTS[0]], samples=1))
    _, state = nnx.split(random_model("llama"))
    noise = jax.random.key(3)
    changed = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(noise, x.shape, x.dtype), state)
    engine.prefill([Request(id=7, prompt=PROMPTS[1], max_new_tokens=4)])  # lives across the update
    assert engine.update_weights(changed) == 1
    (after,) = engine.generate(_requests([PROMPTS[0]], samples=1))
    assert (before.versions == 0).all() and (after.versions == 1).all()
    assert not np.allclose(before.policy_logprobs, after.policy_logprobs, atol=1e-3)
    # The same prompt after the update shares none of the blocks its old-weights sequence holds, and samples
    # what an engine made with the new weights samples.
    engine.prefill([Request(id=8, prompt=PROMPTS[1], max_new_tokens=4)])
    assert not set(engine._sequences[7].blocks) & set(engine._sequences[8].blocks)
    fresh = _engine(num_slots=2)
    fresh.update_weights(changed)
    expected = fresh.generate([Request(id=8, prompt=PROMPTS[1], max_new_tokens=4)])[0]
    np.testing.assert_array_equal(engine.decode()[8].tokens, expected.tokens)
    with pytest.raises(ValueError, match="same structure"):
        engine.update_weights({"not": jnp.zeros(3)})


def test_bad_requests_get_one_line_errors_and_leave_the_sequences_in_flight_alone():
    engine = _engine(num_slots=4, max_context=32, num_blocks=8)
    engine.prefill(_requests([PROMPTS[0]], samples=1, sampling=SAMPLED))
    with pytest.raises(ConfigError, match="exceed the engine's context of 32; shorten the prompt") as error:
        engine.prefill([Request(id=5, prompt=list(range(3, 30)), max_new_tokens=8)])
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="needs 8 blocks of 4 but the cache has 7; raise num_blocks"):
        engine.prefill([Request(id=6, prompt=[3], max_new_tokens=31)])
    # One that fits an empty cache but not beside request 0 (5 of the 7 blocks reserved) must wait.
    with pytest.raises(ValueError, match="may need 6 blocks but 2 are free; release sequences or wait"):
        engine.prefill([Request(id=9, prompt=[3] * 9, max_new_tokens=12)])
    with pytest.raises(KeyError, match="no live sequence with id 99"):
        engine.extend(99, [4, 5], max_new_tokens=2)
    with pytest.raises(ValueError, match="already in flight"):
        engine.prefill(_requests([PROMPTS[1]], samples=1))
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        engine.prefill([Request(id=8, prompt=[3], max_new_tokens=0)])
    with pytest.raises(ValueError, match=r"draw_origin must be an int in \[0, 2\] \(the prompt's length at most\), got 3"):
        engine.prefill([Request(id=8, prompt=[3, 4], max_new_tokens=2, draw_origin=3)])
    with pytest.raises(ValueError, match="create the Engine with key="):
        Engine(random_model("llama"), max_context=32).prefill([Request(id=0, prompt=[3], max_new_tokens=2,
                                                                      sampling=SAMPLED)])
    with pytest.raises(ValueError, match="still running; decode until it stops"):
        engine.extend(0, [4], max_new_tokens=2)
    (undisturbed,) = _engine(num_slots=4, max_context=32).generate(_requests([PROMPTS[0]], samples=1, sampling=SAMPLED))
    engine.decode()
    np.testing.assert_array_equal(engine.release(0).tokens, undisturbed.tokens)
    assert engine.blocks_in_use == 0


def test_block_allocator_counts_references_and_refuses_what_it_lacks():
    allocator = BlockAllocator(num_blocks=5, block_size=4)
    first = allocator.allocate(3)
    assert 0 not in first and allocator.num_free == 1
    allocator.share(first[:2])
    allocator.release(first)
    assert allocator.num_free == 2 and allocator.references(first[0]) == 1
    with pytest.raises(OutOfBlocks, match="3 blocks needed but 2 of 4 are free"):
        allocator.allocate(3)
    allocator.release(first[:2])
    assert allocator.num_free == 4
    with pytest.raises(ValueError, match="released more often than it was held"):
        allocator.release(first[:1])


def _paged_kernel_engine(family="llama", attention="pallas_tpu", **kwargs):
    """An engine whose model attends with `attention` (its Pallas kernels interpreted on this CPU): a model of its
    own, not the cached one the other tests share."""
    model = random_model.__wrapped__(family)
    model.attention = attention
    kwargs.setdefault("num_slots", 4)
    return Engine(model, max_context=kwargs.pop("max_context", 64), block_size=4, key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize("family, attention", [("llama", "pallas_tpu"), ("gemma3", "pallas_tpu"),
                                               ("llama", "pallas_gpu"), ("gemma3", "pallas_gpu")])
def test_a_backend_with_a_paged_kernel_decodes_reading_the_blocks_in_place(family, attention, monkeypatch):
    """With a paged kernel (the TPU's and the GPU's) the decode chunks read the pool's blocks in place
    (`Decoder.paged_decode_step`: no dense view, each step's keys written to their blocks): the greedy tokens of
    `generate` (Llama: each prompt's blocks read once by its 2 samples, a shared prefix; Gemma: its sliding windows
    over the pool, no shared prefixes)."""
    traced = []
    paged_step = Decoder.paged_decode_step
    monkeypatch.setattr(Decoder, "paged_decode_step",
                        lambda self, *a, **k: traced.append(1) or paged_step(self, *a, **k))
    engine = _paged_kernel_engine(family, attention)
    assert engine.reads_pages_in_place and not _engine(family).reads_pages_in_place
    expected = np.repeat(greedy_reference(family, PROMPTS, NEW_TOKENS), 2, axis=0)
    np.testing.assert_array_equal(_padded(engine.generate(_requests(PROMPTS))), expected)
    assert traced


def test_in_place_reads_sample_what_the_dense_views_sample_on_one_device_and_a_mesh():
    """Sampled tokens and log-probs through the blocks read in place equal the dense views' (the default here), with
    shared prefixes, on 8 slots and on a 4 x 2 data x fsdp mesh of 16 (tables of shard-local ids), and a tool turn's
    `extend` continues the same."""
    requests = _requests(PROMPTS, samples=3, sampling=TRUNCATED) + _long_tailed_requests(10)
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])
    for slots, on in ((8, None), (16, mesh)):  # the same slots both ways: a draw may move with the batch's shape
        paged = _paged_kernel_engine(num_slots=slots, max_context=32, mesh=on)
        dense = _engine(num_slots=slots, max_context=32)
        if on is None:
            for a, b in zip(paged.generate(requests), dense.generate(requests)):
                np.testing.assert_array_equal(a.tokens, b.tokens)
                np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        else:
            _assert_same_rollouts_and_tool_turn(paged, dense, requests)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_paged_decode_reads_through_xla_where_the_attention_has_no_paged_kernel(family):
    """`Decoder.paged_decode_step` on a backend without a paged reader (the XLA attention here, asked to read in
    place: `Engine(in_place=True)`) reads each row's blocks with `xla_paged_attention_state`: the same greedy
    tokens."""
    expected = np.repeat(greedy_reference(family, PROMPTS, NEW_TOKENS), 2, axis=0)
    engine = _engine(family, in_place=True)
    assert engine.reads_pages_in_place and not engine_programs.backends.for_program("xla", None).reads_pages_in_place
    np.testing.assert_array_equal(_padded(engine.generate(_requests(PROMPTS))), expected)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_decode_steps_over_weights_split_per_layer_equal_the_layer_scan(family):
    """A GPU's decode loop runs its layers one after the other over weights split per layer before the loop
    (`memory_forms.split_layers`, which `pack_weights` gives on a GPU), not a scan slicing the stacks: the same
    hidden states and cache, Gemma's sliding layers and QLoRA adapters included, and the same greedy tokens through
    the engine reading its blocks in place (the GPU's forms and its Triton paged kernel, interpreted here)."""
    from jaxgrpo.models import backend, memory_forms

    from jaxgrpo.models import lora

    model = random_model(family)
    tokens = jnp.array([[3], [7]], jnp.int32)
    # The model, and with QLoRA adapters (their A and B, the base weights nf4 as qwix stores them) split alike.
    qlora = lora.apply(nnx.clone(model), rank=4, alpha=8.0, targets=("q", "v", "gate"), quantize_base="nf4", seed=1)
    for decoder in (model, qlora):
        cache = decoder.init_cache(2, 8)
        split = memory_forms.split_layers(decoder)
        assert len(split.layers) == decoder.config.num_layers
        for index in (0, 5):
            positions = jnp.full((2, 1), index, jnp.int32)
            kv_mask = jnp.broadcast_to(jnp.arange(8)[None] <= index, (2, 8))
            want = decoder.decode_step(tokens, positions, cache=cache, cache_index=index, kv_mask=kv_mask)
            got = decoder.decode_step(tokens, positions, cache=cache, cache_index=index, kv_mask=kv_mask,
                                      packed_weights=split)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
            cache = want[1]

    packed = []
    forms = memory_forms.GPU._replace(pack_weights=lambda m: packed.append(1) or memory_forms.split_layers(m))
    engine = _paged_kernel_engine(family, "pallas_gpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "memory_for_program", lambda: forms)
        jax.clear_caches()  # traced anew with these forms (another test may have traced the same shapes) ...
        try:
            completions = engine.generate(_requests(PROMPTS))
        finally:
            jax.clear_caches()  # ... and no later test reuses what they traced
    assert packed  # the decode program split the weights
    expected = np.repeat(greedy_reference(family, PROMPTS, NEW_TOKENS), 2, axis=0)
    np.testing.assert_array_equal(_padded(completions), expected)
