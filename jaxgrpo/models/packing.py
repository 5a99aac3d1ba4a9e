"""Packed prompt groups: a prompt and its G completions as one row, the prompt run once.

A GRPO batch holds G completions of each prompt, stored as padded rows `[prompt (left padded),
completion (right padded)]`. Run as stored, each prompt goes through the network G times and every
completion is padded to the longest one's budget. Packed, the group becomes one row of a tree

    trunk: prompt[:-1]  |  branch 1: prompt[-1], completion 1  |  ...  |  branch G: prompt[-1], completion G

where each branch attends to the trunk and to itself only (the decoder's `branch_ids`) and continues
the trunk's positions, so every hidden state equals the padded row's ("Prefix Grouper: Efficient
GRPO Training through Shared-Prefix Forward", 2025, here fused with sequence packing). The last
prompt token is repeated in each branch so that every slot predicts at most one token: slot t of
branch g predicts the branch's next token. A row that does not train (its loss mask is all zero)
keeps only that repeated token, so its completion costs nothing.

Several groups can share a row (segment ids keep them apart): `plan_rows` balances a minibatch's
groups over its micro-batches and packs each micro-batch into the fewest slots, on the host.
`pack_groups` and `unpack` are pure and jittable; the row count and length are static.

A tree needs its rows to hold one prompt. Where a group's rows do not (a hinted sample among unhinted ones,
environment episodes that open differently), the trainer packs trees of one row each (`group_size=1`: the
prompt and its completion, whose padding still goes), as `shares_prompts` decides per batch
(`jaxgrpo.train.batch.packed_trees`, agreed by every host).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.distributed import round_up
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.logprobs import token_logprobs_and_entropy

#: Packed rows are padded to a multiple of this many slots, so a run compiles few update programs.
PACK_MULTIPLE = 64


class PackedGroups(NamedTuple):
    """R packed rows of T slots, and where each completion token's prediction lives."""

    tokens: jax.Array  # i32[R, T]
    positions: jax.Array  # i32[R, T]
    segment_ids: jax.Array  # i32[R, T] j + 1 on the slots of the row's j-th group, 0 on padding
    branch_ids: jax.Array  # i32[R, T] 0 on a trunk (a prompt), g + 1 on completion g's branch
    targets: jax.Array  # i32[R, T] the token slot t predicts (0 where it predicts none)
    slots: jax.Array  # i32[B, C] flat slot (row * T + t) predicting row b's completion token c, -1 if not packed


class RowPlan(NamedTuple):
    """Where each group of a micro-batch goes: `rows` packed rows of `length` slots (static), and per
    micro-batch the row and first slot of each of its groups (int [micro-batches, groups per micro-batch])."""

    length: int
    rows: int
    group_rows: np.ndarray
    group_offsets: np.ndarray


def _lengths(attention_mask, train_mask, completion_len: int):
    """(real prompt lengths [B], completion tokens to pack [B]) of padded rows."""
    attention_mask = attention_mask.astype(bool)
    prompt_len = attention_mask.shape[-1] - completion_len
    prompt = attention_mask[..., :prompt_len].sum(-1)
    completion = attention_mask[..., prompt_len:].sum(-1)
    if train_mask is not None:
        completion = completion * (train_mask > 0).any(-1)
    return prompt, completion


def _group_sizes(prompt, completion):
    """Slots each group needs packed [J], from its prompt length [J] and completion lengths [J, G]:
    the trunk's p - 1 slots, then per completion the repeated last prompt token and its n tokens."""
    return prompt - 1 + completion.shape[-1] + completion.sum(-1)


def shares_prompts(tokens, attention_mask, completion_len: int, group_size: int) -> bool:
    """Whether each group of `group_size` consecutive padded rows holds one prompt (tokens and mask), as a
    packed tree of the group needs (host arrays)."""
    tokens, attention_mask = np.asarray(tokens), np.asarray(attention_mask).astype(bool)
    prompt_len = tokens.shape[-1] - completion_len
    prompt = np.where(attention_mask[:, :prompt_len], tokens[:, :prompt_len], -1)
    groups = prompt.reshape(-1, group_size, prompt_len)
    return bool((groups == groups[:, :1]).all())


def group_lengths(attention_mask, train_mask, completion_len: int, group_size: int):
    """Slots each group needs packed [B / G]: prompt - 1 + sum of (1 + completion)."""
    xp = np if isinstance(attention_mask, np.ndarray) else jnp
    prompt, completion = _lengths(attention_mask, train_mask, completion_len)
    return xp.asarray(_group_sizes(prompt.reshape(-1, group_size)[:, 0], completion.reshape(-1, group_size)))


def packed_length(longest: int, multiple: int = PACK_MULTIPLE) -> int:
    """`longest` slots rounded up to a multiple of `multiple` (the static packed row length)."""
    return max(multiple, round_up(int(longest), multiple))


def _first_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, offset) of each item packed into rows of `capacity` slots, longest first."""
    rows, offsets, filled = np.zeros(len(lengths), np.int32), np.zeros(len(lengths), np.int32), []
    for i in np.argsort(-lengths, kind="stable"):
        row = next((r for r, used in enumerate(filled) if used + lengths[i] <= capacity), len(filled))
        if row == len(filled):
            filled.append(0)
        rows[i], offsets[i] = row, filled[row]
        filled[row] += lengths[i]
    return rows, offsets


def attention_scale(config) -> float:
    """The row length at which a token's attention costs as much as its layer's matmuls, for `plan_rows`.

    Per token and layer the weights cost ~2 * (layer parameters) FLOPs and attention over a row of T
    slots ~4 * T * heads * head_dim (scores and values, computed for the whole row): equal at T = this.
    """
    c = config
    layer = (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
             + 3 * c.hidden_size * c.intermediate_size)
    return layer / (2 * c.num_heads * c.head_dim)


def plan_rows(minibatch_rows: np.ndarray, lengths: np.ndarray, group_size: int, micro_batch: int,
              multiple: int = PACK_MULTIPLE, attention_scale: float | None = None) -> tuple[np.ndarray, RowPlan]:
    """Packs a minibatch's groups into micro-batches of packed rows (on the host).

    Args:
      minibatch_rows: the minibatch's row indices, whole groups of `group_size` consecutive rows in order
        (group k holds rows k*G .. k*G + G - 1).
      lengths: slots each group of the batch needs (`group_lengths`), indexed by group.
      micro_batch: rows per micro-batch (a multiple of G).

    Returns the rows reordered so that each micro-batch's groups have balanced total lengths (longest
    group first, each to the micro-batch with the fewest slots so far: the summed gradient is the
    same), and the `RowPlan`: the row length T (a multiple of `multiple`, at least the longest group)
    and row count R of the cheapest layout, each micro-batch packed first-fit decreasing. The cost is
    R * T slots, times (1 + T / attention_scale) when given (longer rows make attention dearer: see
    `attention_scale`).
    """
    groups = minibatch_rows.reshape(-1, group_size)[:, 0] // group_size
    per_micro = micro_batch // group_size
    num_micro = len(groups) // per_micro
    size = lengths[groups].astype(np.int64)
    members: list[list[int]] = [[] for _ in range(num_micro)]
    totals = np.zeros(num_micro, np.int64)
    for i in np.argsort(-size, kind="stable"):
        open_ = [m for m in range(num_micro) if len(members[m]) < per_micro]
        m = min(open_, key=lambda k: totals[k])
        members[m].append(i)
        totals[m] += size[i]
    ordered = np.array([groups[i] for m in members for i in m])
    micro_sizes = size[np.concatenate([np.array(m, int) for m in members])].reshape(num_micro, per_micro)

    def cost(plan: RowPlan) -> float:
        return plan.rows * plan.length * (1 + (plan.length / attention_scale if attention_scale else 0))

    best = None
    shortest = packed_length(micro_sizes.max(), multiple)
    for length in range(shortest, packed_length(micro_sizes.sum(1).max(), multiple) + 1, multiple):
        placed = [_first_fit_decreasing(sizes, length) for sizes in micro_sizes]
        rows = max(int(r.max()) + 1 for r, _ in placed)
        plan = RowPlan(length, rows, np.stack([r for r, _ in placed]), np.stack([o for _, o in placed]))
        if best is None or cost(plan) < cost(best):
            best = plan
        if rows == 1:
            break
    reordered = (ordered[:, None] * group_size + np.arange(group_size)).ravel()
    return reordered, best


def pack_groups(tokens, attention_mask, completion_len: int, group_size: int, length: int, train_mask=None, *,
                rows: int | None = None, group_rows=None, group_offsets=None) -> PackedGroups:
    """Packs padded rows, G consecutive rows per prompt, into rows of prompt-group trees.

    Args:
      tokens: int [B, P + C], the left-padded prompt then the completion (the G rows of a group share the prompt).
      attention_mask: bool [B, P + C], True on real tokens.
      completion_len: C.
      group_size: G; B must be a multiple of it.
      length: T, the packed row length.
      train_mask: [B, C] or None; rows whose mask is all zero pack no completion token.
      rows, group_rows, group_offsets: R packed rows, and the row and first slot of each group
        (int [B / G], e.g. from `plan_rows`); by default each group has a row of its own. Groups
        must fit (`group_lengths`): a group running past its row's end is cut off.
    """
    batch, width = tokens.shape
    if batch % group_size:
        raise ValueError(f"{batch} rows do not split into groups of group_size={group_size}")
    num_groups, g = batch // group_size, group_size
    if group_rows is None:
        rows, group_rows, group_offsets = num_groups, jnp.arange(num_groups), jnp.zeros(num_groups, jnp.int32)
    prompt_len = width - completion_len
    prompt, completion = _lengths(attention_mask, train_mask, completion_len)
    p = prompt.reshape(num_groups, g)[:, 0].astype(jnp.int32)  # [J]
    n = completion.reshape(num_groups, g).astype(jnp.int32)  # [J, G]
    sizes = _group_sizes(p, n)
    # Within its group, branch g starts after the trunk (p - 1 slots) and the earlier branches (1 + n_h slots each).
    starts = (p - 1)[:, None] + jnp.cumsum(1 + n, axis=1) - (1 + n)  # [J, G]

    t = jnp.arange(length)
    member = ((group_rows[None, None, :] == jnp.arange(rows)[:, None, None])
              & (group_offsets <= t[:, None]) & (t[:, None] < group_offsets + sizes))  # [R, T, J]
    used = member.any(-1)
    j = jnp.argmax(member, axis=-1)  # the group at each slot
    local = t[None] - group_offsets[j]
    trunk = p[j] - 1
    in_trunk = used & (local < trunk)
    branch = jnp.clip(jnp.sum(local[..., None] >= starts[j], axis=-1) - 1, 0, g - 1)
    offset = local - starts[j, branch]  # 0 is the repeated last prompt token
    branch_len = n[j, branch]
    in_branch = used & ~in_trunk

    first_row = j * g
    source_row = jnp.where(in_trunk, first_row, first_row + branch)
    source_col = jnp.where(in_trunk, prompt_len - p[j] + local, prompt_len - 1 + offset)
    source_col = jnp.where(used, source_col, 0)
    packed_tokens = jnp.where(used, tokens[source_row, source_col], 0)
    predicts = in_branch & (offset < branch_len)
    targets = jnp.where(predicts, tokens[source_row, jnp.minimum(source_col + 1, width - 1)], 0)
    positions = jnp.where(in_trunk, local, p[j] - 1 + offset)

    # Completion token c of row (group, b) is predicted by slot offset + starts[group, b] + c of the group's row.
    first = (group_rows * length + group_offsets)[:, None] + starts  # [J, G]
    slots = first.reshape(batch, 1) + jnp.arange(completion_len)[None]
    slots = jnp.where(jnp.arange(completion_len)[None] < completion[:, None], slots, -1)
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return PackedGroups(i32(packed_tokens), i32(jnp.where(used, positions, 0)), i32(jnp.where(used, j + 1, 0)),
                        i32(jnp.where(in_branch, branch + 1, 0)), i32(targets), i32(slots))


def unpack(values: jax.Array, packed: PackedGroups) -> jax.Array:
    """Per-slot values [R, T, ...] -> per completion token [B, C, ...] (0 where a row packed no token there)."""
    flat = values.reshape((-1,) + values.shape[2:])
    taken = flat[jnp.maximum(packed.slots, 0)]
    packed_here = (packed.slots >= 0).reshape(packed.slots.shape + (1,) * (values.ndim - 2))
    return jnp.where(packed_here, taken, 0)


def packed_completion_outputs(decoder, packed: PackedGroups, *, temperature: float = 1.0, value_head=None):
    """(log-probs, entropies, values or None) [B, C] of the completion tokens, from one packed forward.

    Equal to scoring the padded rows (`jaxgrpo.train.step.completion_outputs`) on every token a row packed.
    """
    layout = AttentionLayout.branches(packed.segment_ids, packed.branch_ids)
    hidden = decoder.forward(packed.tokens, packed.positions, layout)
    logp, entropy = token_logprobs_and_entropy(
        hidden, decoder.unembedding(), packed.targets, temperature=temperature,
        logit_softcap=decoder.config.final_logit_softcapping,
    )
    values = None if value_head is None else unpack(value_head(hidden), packed)
    return unpack(logp, packed), unpack(entropy, packed), values
