"""Packed prompt groups (jaxgrpo.models.packing): one tree row per prompt and its G completions scores
every completion token exactly as the padded rows do, in values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.support.tiny_models import llama_and_gemma3

from jaxgrpo.models import Decoder, DecoderConfig
from jaxgrpo.models import packing
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.decoder import positions_from_mask
from jaxgrpo.models.logprobs import token_logprobs_and_entropy

CONFIGS = llama_and_gemma3(sliding_window=3)
GROUP, PROMPT, COMPLETION = 3, 6, 5
PROMPT_LENGTHS = (6, 3)  # group 1's prompt is left-padded
COMPLETION_LENGTHS = ((5, 2, 0), (1, 4, 3))  # a row may stop early or produce nothing


def _padded_batch(vocab):
    """Padded rows [prompt (left padded), completion (right padded)] of 2 groups of 3, and a loss mask."""
    rng = np.random.default_rng(0)
    rows = []
    attention = []
    for group, p in enumerate(PROMPT_LENGTHS):
        prompt = rng.integers(1, vocab, PROMPT)
        for n in COMPLETION_LENGTHS[group]:
            completion = rng.integers(1, vocab, COMPLETION)
            rows.append(np.concatenate([prompt, completion]))
            attention.append(np.concatenate([np.arange(PROMPT) >= PROMPT - p, np.arange(COMPLETION) < n]))
    attention = np.stack(attention)
    tokens = np.where(attention, np.stack(rows), 0)
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(attention), jnp.asarray(attention[:, PROMPT:], jnp.float32)


def _padded_outputs(model, tokens, attention, temperature):
    hidden = model.forward(tokens, positions_from_mask(attention, None, tokens.shape[1]), AttentionLayout.padded(attention))
    return token_logprobs_and_entropy(hidden[:, PROMPT - 1:-1], model.unembedding(), tokens[:, PROMPT:],
                                      temperature=temperature, logit_softcap=model.config.final_logit_softcapping)


def test_the_packed_layout_is_a_trunk_then_one_branch_per_completion():
    tokens, attention, mask = _padded_batch(61)
    lengths = packing.group_lengths(np.asarray(attention), np.asarray(mask), COMPLETION, GROUP)
    # prompt - 1 + G + sum of completion lengths: 5 + 3 + 7 and 2 + 3 + 8.
    np.testing.assert_array_equal(lengths, [15, 13])
    packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, 16, mask)
    t = np.asarray(tokens)
    row = np.asarray(packed.tokens[1])
    # Group 1: trunk = its prompt's first 2 real tokens; then [last prompt token, completion] x 3.
    prompt = t[3, PROMPT - 3:PROMPT]
    expected = np.concatenate([prompt[:2], prompt[2:], t[3, PROMPT:PROMPT + 1], prompt[2:], t[4, PROMPT:PROMPT + 4],
                               prompt[2:], t[5, PROMPT:PROMPT + 3], [0, 0, 0]])
    np.testing.assert_array_equal(row, expected)
    np.testing.assert_array_equal(packed.branch_ids[1], [0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0])
    np.testing.assert_array_equal(packed.positions[1], [0, 1, 2, 3, 2, 3, 4, 5, 6, 2, 3, 4, 5, 0, 0, 0])
    np.testing.assert_array_equal(packed.segment_ids[1], [2] * 13 + [0] * 3)
    # Each branch slot predicts the branch's next token; row 4's completion token c is predicted by
    # slot 4 + c of packed row 1 (flat index 16 + 4 + c).
    np.testing.assert_array_equal(packed.targets[1, 4:9], [*t[4, PROMPT:PROMPT + 4], 0])
    np.testing.assert_array_equal(packed.slots[4], [20, 21, 22, 23, -1])
    np.testing.assert_array_equal(packed.slots[2], [-1] * COMPLETION)  # row 2 produced nothing


def test_rows_that_do_not_train_pack_no_completion():
    tokens, attention, mask = _padded_batch(61)
    mask = mask.at[1].set(0.0)
    lengths = packing.group_lengths(np.asarray(attention), np.asarray(mask), COMPLETION, GROUP)
    np.testing.assert_array_equal(lengths, [13, 13])
    packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, 16, mask)
    np.testing.assert_array_equal(packed.slots[1], [-1] * COMPLETION)


@pytest.mark.parametrize("shared_row", [False, True], ids=["row_per_group", "groups_share_a_row"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_packed_groups_score_completions_like_padded_rows(family, shared_row):
    model = Decoder(CONFIGS[family], rngs=nnx.Rngs(0))
    tokens, attention, mask = _padded_batch(CONFIGS[family].vocab_size)
    graphdef, params = nnx.split(model)
    lengths = packing.group_lengths(np.asarray(attention), None, COMPLETION, GROUP)
    if shared_row:  # both groups in one row of 32 slots, group 0 after group 1
        packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, 32, rows=1, group_rows=jnp.array([0, 0]),
                                     group_offsets=jnp.array([int(lengths[1]), 0]))
        assert set(np.asarray(packed.segment_ids[0])) == {0, 1, 2}
    else:
        packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, packing.packed_length(lengths.max(), 8))

    def packed_outputs(p):
        logp, entropy, _ = packing.packed_completion_outputs(nnx.merge(graphdef, p), packed, temperature=0.7)
        return logp, entropy

    got = jax.jit(packed_outputs)(params)
    want = jax.jit(lambda p: _padded_outputs(nnx.merge(graphdef, p), tokens, attention, 0.7))(params)
    real = np.asarray(mask) > 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g)[real], np.asarray(w)[real], rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(g)[~real] == 0)


def test_rows_whose_group_holds_two_prompts_pack_as_trees_of_one_row_and_score_like_padded_rows():
    """A group whose rows do not hold one prompt (a hinted sample, an episode that opened differently) cannot be one
    tree (`shares_prompts` is false) and every row packs as a tree of its own, scoring its completion as the padded
    row."""
    family = next(iter(CONFIGS))
    model = Decoder(CONFIGS[family], rngs=nnx.Rngs(0))
    tokens, attention, mask = _padded_batch(CONFIGS[family].vocab_size)
    # Left padding differs (masked tokens are not the prompt): the groups still hold one prompt each.
    assert packing.shares_prompts(np.where(attention, tokens, 7), attention, COMPLETION, GROUP)
    hinted = np.asarray(tokens).copy()
    hinted[1, PROMPT - 2] = hinted[1, PROMPT - 2] % (CONFIGS[family].vocab_size - 1) + 1  # row 1's prompt differs
    hinted = jnp.asarray(hinted)
    assert not packing.shares_prompts(hinted, attention, COMPLETION, GROUP)
    lengths = packing.group_lengths(np.asarray(attention), None, COMPLETION, 1)
    np.testing.assert_array_equal(lengths, [p + n for p in PROMPT_LENGTHS for n in COMPLETION_LENGTHS[0 if p == 6 else 1]])
    order, plan = packing.plan_rows(np.arange(len(lengths)), lengths, 1, len(lengths), multiple=8)
    hinted, attention, mask = hinted[order], attention[order], mask[order]  # the plan's order: longest first
    packed = packing.pack_groups(hinted, attention, COMPLETION, 1, plan.length, rows=plan.rows,
                                 group_rows=jnp.asarray(plan.group_rows[0]), group_offsets=jnp.asarray(plan.group_offsets[0]))
    assert plan.rows < len(lengths)  # trees of one row share packed rows
    graphdef, params = nnx.split(model)
    got = packing.packed_completion_outputs(nnx.merge(graphdef, params), packed, temperature=0.7)[:2]
    want = _padded_outputs(model, hinted, attention, 0.7)
    real = np.asarray(mask) > 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g)[real], np.asarray(w)[real], rtol=1e-5, atol=1e-5)
    assert plan.rows * plan.length < hinted.size  # the padding is gone


def test_packed_gradients_equal_padded_gradients():
    model = Decoder(CONFIGS["gemma3"], rngs=nnx.Rngs(1))
    tokens, attention, mask = _padded_batch(CONFIGS["gemma3"].vocab_size)
    graphdef, params = nnx.split(model)
    packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, 16, mask)
    weights = jax.random.normal(jax.random.key(2), mask.shape) * mask

    def packed_loss(p):
        logp, entropy, _ = packing.packed_completion_outputs(nnx.merge(graphdef, p), packed)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(mask * entropy)

    def padded_loss(p):
        logp, entropy = _padded_outputs(nnx.merge(graphdef, p), tokens, attention, 1.0)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(mask * entropy)

    got, want = jax.jit(jax.grad(packed_loss))(params), jax.jit(jax.grad(padded_loss))(params)
    # float32 sums over different layouts, in an order that depends on the CPU's vector width: relative to the
    # gradient (an AVX-512 EPYC differed by 2e-6 of an entry of 7.6), not only absolute.
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_packing_checks_its_inputs():
    tokens, attention, mask = _padded_batch(61)
    with pytest.raises(ValueError, match="do not split into groups of group_size=4"):
        packing.pack_groups(tokens, attention, COMPLETION, 4, 16)
    model = Decoder(CONFIGS["llama"], rngs=nnx.Rngs(0))
    packed = packing.pack_groups(tokens, attention, COMPLETION, GROUP, 16)
    with pytest.raises(ValueError, match=r"the layout's branch_ids must be \[batch, length\]"):
        model.forward(packed.tokens, packed.positions, AttentionLayout.branches(packed.segment_ids, packed.branch_ids[:, 1:]))
    with pytest.raises(ValueError, match="forward needs positions"):
        model.forward(packed.tokens, None, AttentionLayout.branches(packed.segment_ids, packed.branch_ids))


def test_plan_rows_balances_micro_batches_and_packs_the_fewest_slots():
    lengths = np.array([391, 95, 300, 100, 250, 120, 200, 150])  # 8 groups of G=4, 32 rows
    rows, plan = packing.plan_rows(np.arange(32), lengths, 4, 8)
    groups = rows.reshape(-1, 4)
    assert np.all(groups == groups[:, :1] + np.arange(4))  # whole groups, rows in order
    assert sorted(groups[:, 0] // 4) == list(range(8))
    micro = (groups[:, 0] // 4).reshape(4, 2)  # longest with shortest: totals 486, 400, 370, 350
    assert sorted(lengths[micro].sum(1)) == [350, 370, 400, 486]
    assert (plan.length, plan.rows) == (512, 1)  # 4 x 512 slots, where a row per group needs 8 x 448
    np.testing.assert_array_equal(plan.group_rows, 0)
    for m in range(4):  # the two groups of a micro-batch do not overlap
        offsets, sizes = plan.group_offsets[m], lengths[micro[m]]
        first = np.argmin(offsets)
        assert offsets[first] == 0 and offsets[1 - first] == sizes[first]
    # Long groups that cannot share a row each get one.
    _, plan = packing.plan_rows(np.arange(16), np.array([300, 290, 20, 10]), 4, 16)
    assert (plan.length, plan.rows) == (320, 2)
    np.testing.assert_array_equal(plan.group_rows[0], [0, 1, 0, 1])  # 300 + 20 and 290 + 10


def test_plan_rows_weighs_attention_against_padding():
    lengths = np.array([200, 190, 180, 170])
    _, plan = packing.plan_rows(np.arange(16), lengths, 4, 16)
    assert (plan.rows, plan.length) == (2, 384)  # the fewest slots (first of the ties with 1 x 768)
    _, plan = packing.plan_rows(np.arange(16), lengths, 4, 16, attention_scale=100.0)
    assert (plan.rows, plan.length) == (4, 256)  # attention dear: short rows
    config = DecoderConfig(family="llama", vocab_size=10, hidden_size=576, intermediate_size=1536, num_layers=1,
                           num_heads=9, num_kv_heads=3, head_dim=64)
    assert round(packing.attention_scale(config)) == 3072  # SmolLM2-135M: 3.54M weights per layer


def test_packed_length_rounds_up_to_the_multiple():
    assert packing.packed_length(1) == 64
    assert packing.packed_length(64) == 64
    assert packing.packed_length(65) == 128
    assert packing.packed_length(13, 8) == 16
