"""A decoder-only transformer in `flax.nnx` covering Llama, Qwen2, Qwen3 and Gemma 3.

The layers' parameters are stacked along a leading `layers` axis and run with one `lax.scan`,
so compile time does not grow with depth (a GPU's decode loop runs them one after the other over
weights split per layer: see packed weights below; so does an uncached forward with `scan_layers=False`).
Every parameter carries `logical_axes` metadata (e.g. `("layers", "embed", "heads", "head_dim")`) that
`partitioning.shard_model` maps onto a mesh.

Calling conventions (`B` batch, `T` new tokens, `C` cache capacity, `L` layers, `V` vocabulary):

* Training / scoring: `hidden = model.forward(tokens[B, T], positions[B, T], layout)` with an
  `AttentionLayout` saying which keys each query sees: `padded(valid[B, T])` (True for real tokens; left
  padding), `segments(segment_ids[B, T])` (packed sequences; tokens attend within their own segment, id 0 is
  padding) or `branches(segment_ids, branch_ids)`, packed prompt groups (a tree of branches): `branch_ids[B, T]`
  splits a segment into a shared trunk (branch 0, e.g. a prompt) and branches (ids >= 1, e.g. the G
  completions of that prompt, laid out one after the other). A token attends to the earlier trunk tokens of
  its segment and the earlier tokens of its own branch, never to another branch; each branch continues the
  trunk's positions, and Gemma's sliding windows count positions, not slots. `logits = model(tokens,
  positions=None, attention_mask=... or segment_ids=...)` is the same forward with positions counting real
  tokens (left padding) or restarting at each segment, then `logits_from_hidden`.
* Sampling with the KV cache:

      cache = model.init_cache(batch_size, capacity)          # KVCache of [L, B, kv_heads, C, head_dim]
      hidden, cache = model.decode_step(tokens, positions, cache=cache, cache_index=i, kv_mask=kv_mask)
      # or: logits, cache = model(tokens, positions, cache=cache, cache_index=i, kv_mask=kv_mask)

  writes the T new tokens' keys and values at cache slots [i, i + T) with `lax.dynamic_update_slice`
  (in place when the cache is donated), and the query at slot i + t attends to the slots
  s <= i + t for which `kv_mask[b, s]` is True (for Gemma's sliding layers, also s > i + t - window).
  `kv_mask` is bool[B, C] and must already mark the T slots being written. Prefill is the same
  call with the prompt and `cache_index=0`; RoPE uses `positions`, so left-padded prompts decode
  exactly like unpadded ones. `cache_index` may be traced.
* A shared prefix: G rows continuing the same prompt can read that prompt's keys and values from
  one copy instead of G. Pass `prefix=KVCache` of [L, P_rows, kv_heads, P, head_dim] (a prefill's
  cache) and `prefix_mask` bool[P_rows, P] with a cached call whose batch is a multiple of P_rows:
  row r reads prefix row r // (batch // P_rows) in full, its slots placed before the row cache's
  (so with the row cache's slot i at distance P + i - s from prefix slot s for sliding windows).
  Each prompt's keys are then read once per step for all its rows, with their queries stacked
  into one product, and stored once.
* Packed weights (a decode loop): `packed = model.pack_weights()` once before the loop, then
  `model(..., packed_weights=packed)`. On a CPU it multiplies by them through a CPU kernel
  (`jaxgrpo.models.cpu_forms`: bfloat16, unsharded, AVX512-BF16); on a GPU they are the layer weights split per
  layer (`memory_forms.LayerWeights`) and the layers run one after the other over them instead of scanning the
  stacks, whose slices XLA:GPU copies every step; None elsewhere, where passing None changes nothing. No
  derivative.
* The backend (`jaxgrpo.models.backend`, `Decoder.backend(mesh)`): everything that differs per backend sits
  behind one object, picked once per call, so the math here reads the same on every backend. Its `memory`
  forms read and write the weights and the cache and multiply by the weights (the plain `lax` operations
  on accelerators, forms tuned for XLA:CPU in programs that run on CPUs: `jaxgrpo.models.memory_forms`);
  its `attention` implementation (`attention=` at construction: "auto" is splash attention on a TPU, the
  Pallas flash kernel on a GPU, the XLA math on a CPU) runs the training and scoring attention over a layout
  and reads a decode step's caches where it has a kernel for them (`cache_state`: the Pallas decode kernel on a
  TPU, the C++ kernel on a CPU), the XLA math of `cached_attention.attend_cached` reading them elsewhere.

The two purposes have their own entry points: `forward(tokens, positions, layout)` (training and scoring:
hidden states, with an `AttentionLayout` saying padded, segments or branches) and `decode_step(...)` (a
cached call), the only two; `__call__` dispatches to them from its keyword arguments. Both run
the same layer scan (`_layers`), each layer's attention bound by its entry point.

Where the pieces live: this module holds the model (`Decoder`: its entry points, the layer scan, the cache
write, the logits), its cache (`KVCache`) and the default positions (`mask_positions`, `positions_from_mask`).
The transformer building blocks (RoPE, RMSNorm, the weight products, `Attention`, `MLP` and the residual `Block`
the scan stacks) are `jaxgrpo.models.layers`; the XLA attention of a cached call (a layer's queries over the
shared prefix, the live cache and the new tokens, as online-softmax blocks) is `jaxgrpo.models.cached_attention`.
Their public names (and `PROJECTIONS`) stay importable from here.

Logits are float32 whatever the compute dtype.

On a mesh (one set with `jax.set_mesh`, or the one the parameters are sharded on) activations are
constrained as `partitioning.constrain_activation` says: rows over `data`/`fsdp`, attention heads and
the MLP hidden over `model`; without one nothing is constrained and the numerics are unchanged.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgrpo.models import attention as attention_implementations
from jaxgrpo.models import backend as backends
from jaxgrpo.models.attention import AttentionLayout
from jaxgrpo.models.attention.xla import build_attention_mask, build_branch_mask
from jaxgrpo.models.backend import Backend
from jaxgrpo.models.cached_attention import CachedCall, PagedCall, attend_cached, attend_paged
from jaxgrpo.models.config import PROJECTIONS, DecoderConfig
from jaxgrpo.models.layers import (
    MLP,
    Attention,
    Block,
    RMSNorm,
    apply_rope,
    param,
    rope_inverse_frequencies,
    rope_tables,
)
from jaxgrpo.models.logprobs import soft_cap, token_logprobs_and_entropy
from jaxgrpo.models.memory_forms import LayerWeights, split_layers
from jaxgrpo.models.paged_cache import PagedKVCache, PagedRows
from jaxgrpo.models.partitioning import active_mesh, constrain_activation
from jaxgrpo.models.remat import check_policy, checkpointed

if TYPE_CHECKING:
    from jaxgrpo.models.cpu_forms import PackedWeights

# This module's names, and those it re-exports from their homes (`layers`, `config`, `attention.xla`) so that code
# written against `jaxgrpo.models.decoder` keeps importing them from here.
__all__ = [
    "MLP", "PROJECTIONS", "Attention", "Block", "Decoder", "KVCache", "RMSNorm", "apply_rope", "build_attention_mask",
    "build_branch_mask", "mask_positions", "positions_from_mask", "rope_inverse_frequencies", "rope_tables",
]


class KVCache(NamedTuple):
    """Keys and values of every layer: `k`, `v` of shape [layers, batch, kv_heads, capacity, head_dim].

    Heads-major, so a decode step reads each (row, head)'s live slots as one contiguous block.
    """

    k: jax.Array
    v: jax.Array


def mask_positions(mask):
    """int32 positions of rows of `mask` [B, T] (left padded, or with gaps such as an episode's padding): each real
    token's count of real tokens before it, 0 before the first. A numpy mask gives numpy positions (host-side
    batches), a jax one jax positions (inside programs)."""
    xp = np if isinstance(mask, np.ndarray) else jnp
    return xp.maximum(xp.cumsum(xp.asarray(mask).astype(xp.int32), axis=1) - 1, 0).astype(xp.int32)


def positions_from_mask(attention_mask: jax.Array | None, segment_ids: jax.Array | None, length: int) -> jax.Array:
    """Default positions [B, T]: count of earlier real tokens (left padding) or offset within the segment."""
    index = jnp.arange(length)
    if segment_ids is not None:
        starts = jnp.concatenate(
            [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
        )
        segment_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
        return (index - segment_start).astype(jnp.int32)
    if attention_mask is not None:
        return mask_positions(jnp.asarray(attention_mask))
    return jnp.broadcast_to(index, (1, length)).astype(jnp.int32)


def _check_prefix(prefix: KVCache | None, prefix_mask: jax.Array | None, batch: int) -> None:
    if prefix is None:
        if prefix_mask is not None:
            raise ValueError("prefix_mask was given without a prefix")
        return
    if prefix_mask is None:
        raise ValueError("a prefix needs prefix_mask [prefix rows, prefix length] (True on real tokens)")
    prefix_rows, prefix_length = prefix.k.shape[1], prefix.k.shape[3]
    if prefix_mask.shape != (prefix_rows, prefix_length):
        raise ValueError(f"prefix_mask must be [prefix rows, prefix length] = {(prefix_rows, prefix_length)}, "
                         f"got {prefix_mask.shape}")
    if batch % prefix_rows:
        raise ValueError(f"the batch ({batch} rows) must be a multiple of the prefix's rows ({prefix_rows}): "
                         "consecutive rows share one prefix row")


class Decoder(nnx.Module):
    """The policy: token ids -> logits. See the module docstring for the call and cache contract.

    Args:
      config: the architecture.
      dtype: compute dtype (float32 or bfloat16); attention softmax, norms and logits run in float32.
      param_dtype: parameter dtype.
      remat: recompute each layer's activations in the backward pass instead of storing them: False, True (the
        layer's input kept: "full") or a policy of `jaxgrpo.models.remat.POLICIES` (what else it keeps).
      scan_layers: run an uncached forward (training, scoring) as one `lax.scan` over the stacked layers (compile
        time independent of depth), or, False, the layers one after the other over their weights split per layer
        (`memory_forms.split_layers`): no stacks of activations kept for the backward pass, which XLA:GPU fills
        with zeros, copies and transposes (docs/gpu.md), for a compile time that grows with depth.
      attention: the training/scoring attention implementation, "auto" (the platform's: splash attention
        on a TPU) or one of `jaxgrpo.models.attention.NAMES`; an unknown name is a ValueError here, one
        that does not run on the program's platform at the first call.
      rngs: initializer randomness (loaders overwrite the values).
    """

    def __init__(self, config: DecoderConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 remat: bool | str = False, scan_layers: bool = True, attention: str = attention_implementations.AUTO,
                 rngs: nnx.Rngs):
        attention_implementations.check_name(attention)
        if isinstance(remat, str):
            check_policy(remat)
        c = config
        self.config = c
        self.dtype = dtype
        self.remat = remat
        self.scan_layers = scan_layers
        self.attention = attention
        self.embed = param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), param_dtype)
        self.layers = Block(c, (c.num_layers,), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.final_norm = RMSNorm((), c.hidden_size, "norm", c, param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), param_dtype)

    def init_cache(self, batch_size: int, capacity: int, dtype=None) -> KVCache:
        """An all-zero `KVCache` of [layers, batch_size, kv_heads, capacity, head_dim] (compute dtype by default)."""
        c = self.config
        shape = (c.num_layers, batch_size, c.num_kv_heads, capacity, c.head_dim)
        dtype = dtype or self.dtype
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def unembedding(self) -> jax.Array:
        """The output projection [hidden, vocab] in the compute dtype (the embedding, transposed, when tied)."""
        weight = self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]
        return weight.astype(self.dtype)

    def pack_weights(self) -> PackedWeights | LayerWeights | None:
        """The weights prepared for a decode loop's calls (pass them as `packed_weights=`), by this program's memory
        forms: on a CPU, packed for a C++ kernel where it applies (`cpu_forms.pack_weights`); on a GPU, split per
        layer (`memory_forms.split_layers`); else None, which changes nothing.

        An XLA computation, run once before the loop (a copy of the weights, 270 MB for SmolLM2 on a CPU)."""
        return backends.memory_for_program().pack_weights(self)

    @jax.named_scope("unembed")
    def logits_from_hidden(self, hidden: jax.Array, packed_weights: PackedWeights | None = None) -> jax.Array:
        """Float32 logits [..., V] from final hidden states [..., E], soft-capped where the config says."""
        forms = backends.memory_for_program()
        if packed_weights is not None and not isinstance(packed_weights, LayerWeights):
            logits = forms.product("...e,ev->...v", hidden.astype(self.dtype), packed_weights.unembedding, self.dtype)
        elif self.config.tie_word_embeddings:
            # Contract the embedding's hidden axis in place: XLA:CPU transposes a bfloat16 [V, E] table in
            # float32 (58 against 8 ms a call for SmolLM2's at batch 32), a float32 one for free.
            table, hidden = forms.unembedding_table(self.embed[...].astype(self.dtype), hidden)
            logits = jnp.einsum("...e,ve->...v", hidden, table, preferred_element_type=jnp.float32)
        else:
            logits = jnp.matmul(hidden, self.unembedding(), preferred_element_type=jnp.float32)
        return soft_cap(logits, self.config.final_logit_softcapping)

    def _check_tokens(self, tokens: jax.Array) -> None:
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
        if isinstance(tokens, jax.core.Tracer):
            return
        # numpy, not jnp: this also runs on concrete arrays captured while tracing.
        values = np.asarray(tokens)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}) for this vocabulary, got min {low} and max {high}"
            )

    def attention_implementation(self, mesh=None) -> attention_implementations.AttentionImplementation:
        """The attention implementation this model runs in a program laid out on `mesh` (None: the default
        devices): `self.attention`, or with "auto" the platform's default (`jaxgrpo.models.attention`)."""
        return self.backend(mesh).attention

    def backend(self, mesh=None) -> Backend:
        """This model's backend in a program laid out on `mesh` (None: the default devices): the program's
        memory forms and this model's attention implementation there (`jaxgrpo.models.backend`)."""
        return backends.for_program(self.attention, mesh)

    def forward(self, tokens: jax.Array, positions: jax.Array, layout: AttentionLayout, *,
                packed_weights: PackedWeights | None = None) -> jax.Array:
        """Final-normalized hidden states [B, T, E] of a training or scoring forward (no cache).

        `positions` [B, T] (or [1, T]) feed RoPE; `layout` says which keys each query sees (padded rows,
        packed segments or packed prompt groups: `AttentionLayout`, its arrays [B, T]); the attention runs
        through this model's backend (`backend`). `packed_weights`: this model's `pack_weights()`, multiplied
        by instead of the parameters (no derivative).
        """
        self._check_tokens(tokens)
        if positions is None:
            raise ValueError("forward needs positions [batch, length]; decoder.positions_from_mask gives those of "
                             "left-padded rows or packed segments")
        for name, value in layout._asdict().items():
            if value is not None and value.shape != tokens.shape:
                raise ValueError(f"the layout's {name} must be [batch, length] = {tokens.shape}, got {value.shape}")
        return self._forward(tokens, positions, layout, packed_weights)

    def _hidden_states(self, tokens, positions=None, *, attention_mask=None, segment_ids=None, cache=None,
                       cache_index=None, kv_mask=None, prefix=None, prefix_mask=None, packed_weights=None):
        """`forward` or `decode_step` from `__call__`'s keyword arguments: (hidden states, the updated cache or
        None)."""
        if cache is not None:  # decode_step checks the tokens and the prefix
            return self.decode_step(tokens, positions, cache=cache, cache_index=cache_index, kv_mask=kv_mask,
                                    prefix=prefix, prefix_mask=prefix_mask, packed_weights=packed_weights)
        if prefix is not None or prefix_mask is not None:
            raise ValueError("prefix is read by cached calls only: pass cache, cache_index and kv_mask with it")
        if segment_ids is not None and attention_mask is not None:
            raise ValueError("pass either attention_mask or segment_ids, not both (segment id 0 marks padding)")
        self._check_tokens(tokens)
        batch, length = tokens.shape
        if positions is None:
            positions = positions_from_mask(attention_mask, segment_ids, length)
        if segment_ids is not None:
            layout = AttentionLayout.segments(segment_ids)
        else:
            layout = AttentionLayout.padded(jnp.ones((batch, length), bool) if attention_mask is None else attention_mask)
        return self._forward(tokens, positions, layout, packed_weights), None  # tokens checked, layout built here

    def _forward(self, tokens, positions, layout, packed_weights):
        """`forward` of tokens already checked."""
        c = self.config
        batch, length = tokens.shape
        positions = jnp.broadcast_to(positions, (batch, length))
        mesh = active_mesh(self.embed[...])
        backend = self.backend(mesh)
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        masks = jax.tree.map(rows, backend.attention.prepare(layout, positions, c.sliding_window))

        def attention(sliding, layer):
            return functools.partial(backend.attention.attend, masks=masks, sliding=sliding, window=c.sliding_window,
                                     scale=c.attention_scale, mesh=mesh)

        if packed_weights is None and not self.scan_layers:
            packed_weights = split_layers(self)
        hidden, _ = self._layers(tokens, positions, attention, mesh, backend, packed_weights=packed_weights)
        return hidden

    def decode_step(self, tokens: jax.Array, positions: jax.Array | None = None, *, cache: KVCache,
                    cache_index: jax.Array | int, kv_mask: jax.Array, prefix: KVCache | None = None,
                    prefix_mask: jax.Array | None = None,
                    packed_weights: PackedWeights | None = None) -> tuple[jax.Array, KVCache]:
        """(final-normalized hidden states [B, T, E], updated cache) of a cached call: prefill or a decode
        step (the module docstring's contract). Positions default to the slots written."""
        self._check_tokens(tokens)
        batch, length = tokens.shape
        _check_prefix(prefix, prefix_mask, batch)
        if cache_index is None or kv_mask is None:
            raise ValueError("a cached call needs cache_index (first slot to write) and kv_mask [batch, capacity]")
        batch_and_capacity = (cache.k.shape[1], cache.k.shape[3])
        if kv_mask.shape != batch_and_capacity:
            raise ValueError(f"kv_mask must be [batch, capacity] = {batch_and_capacity}, got {kv_mask.shape}")
        if positions is None:
            positions = cache_index + jnp.arange(length)[None]
        positions = jnp.broadcast_to(positions, (batch, length))
        mesh = active_mesh(self.embed[...])
        backend = self.backend(mesh)
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        window = self.config.sliding_window
        key_valid = kv_mask.astype(bool)
        prefix_valid = None if prefix is None else prefix_mask.astype(bool)
        query_slots = cache_index + jnp.arange(length)
        # (mask over the cached slots [B, T, C], mask among the T new tokens [B, T, T], mask over the prefix
        # [P_rows, T, P] or None) for the XLA math; slots from cache_index on hold stale values until written,
        # so only earlier ones count as cached. A kernel reading a cache (`Backend.cache_state`) leaves its
        # mask unused, and XLA drops it.
        old_valid = key_valid & (jnp.arange(key_valid.shape[1]) < cache_index)[None]
        new_valid = jax.lax.dynamic_slice_in_dim(key_valid, cache_index, length, axis=1)

        def prefix_attention_mask(window):
            if prefix is None:
                return None
            prefix_length = prefix.k.shape[3]
            allowed = jnp.ones((length, prefix_length), bool)
            if window is not None:  # the prefix's slots come before the cache's
                allowed = (prefix_length + query_slots)[:, None] - jnp.arange(prefix_length)[None] < window
            return allowed[None] & prefix_valid[:, None, :]

        def cached_and_new(window):
            return (build_attention_mask(query_slots, old_valid, window),
                    build_attention_mask(jnp.arange(length), new_valid, window),
                    prefix_attention_mask(window))

        full_mask = jax.tree.map(rows, cached_and_new(None))
        sliding_mask = jax.tree.map(rows, cached_and_new(window)) if window else full_mask
        call = CachedCall(cache, cache_index, key_valid, (full_mask, sliding_mask), prefix, prefix_valid, backend,
                           window, self.config.attention_scale, mesh)

        def attention(sliding, layer):
            return functools.partial(attend_cached, call=call, layer=layer, sliding=sliding)

        return self._layers(tokens, positions, attention, mesh, backend, cache=cache, cache_index=cache_index,
                            packed_weights=packed_weights)

    def paged_decode_step(self, tokens: jax.Array, *, cache: PagedRows, prefix: PagedRows | None = None,
                          running: jax.Array | None = None, mesh: jax.sharding.Mesh | None = None,
                          packed_weights: PackedWeights | None = None) -> tuple[jax.Array, PagedKVCache]:
        """(final-normalized hidden states [B, T, E], the pool with the new keys and values written) of T
        tokens [B, T] after each row's cached positions in a paged pool (`jaxgrpo.models.paged_cache`): row r's
        tokens at positions `cache.lengths[r] + t`, reading its positions [cache.starts[r], cache.lengths[r])
        through its block table and, with `prefix`, its shared prefix's (row r reads prefix row r // (B / P_rows)),
        each read in place where the backend has a paged reader (`Backend.paged_state`). Rows where `running`
        (bool [B]; default all) is False write their keys to the null block and see none of their new tokens.
        `mesh`: the mesh the pool's blocks and the rows split over (its data and fsdp axes; each row's table holds
        block ids local to its shard, as the rollout engine lays them out); None: the one the weights are on.

        The same math as `decode_step` over a dense cache holding each row's positions (the rollout engine's
        decode on a backend that reads pages in place)."""
        self._check_tokens(tokens)
        batch, length = tokens.shape
        if cache.tables.shape[0] != batch:
            raise ValueError(f"the paged cache has {cache.tables.shape[0]} rows for {batch} rows of tokens")
        window = self.config.sliding_window
        if prefix is not None and (window or batch % prefix.tables.shape[0]):
            raise ValueError(f"a shared prefix of {prefix.tables.shape[0]} rows for {batch} rows of tokens"
                             + (f" with a sliding window ({window}): rows sharing a prefix row sit at different "
                                "distances from it; give each row its whole table, no prefix" if window else
                                ": its rows must divide them"))
        positions = cache.lengths[:, None] + jnp.arange(length)[None]
        weights_mesh = active_mesh(self.embed[...])
        pool_mesh = weights_mesh if mesh is None else mesh
        backend = self.backend(weights_mesh)
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), weights_mesh)  # noqa: E731
        valid = jnp.ones((batch, length), bool) if running is None else jnp.broadcast_to(running[:, None],
                                                                                      (batch, length))
        new_masks = tuple(rows(build_attention_mask(jnp.arange(length), valid, w)) for w in (None, window))
        call = PagedCall(cache, prefix, new_masks, backend, window, self.config.attention_scale, weights_mesh,
                         pool_mesh)

        def attention(sliding, layer):
            return functools.partial(attend_paged, call=call, layer=layer, sliding=sliding)

        def write(new_kv):  # [L, B, T, kv, D] -> the pool's heads-major blocks
            keys, values = (jnp.swapaxes(x, 2, 3) for x in new_kv)
            return backend.write_pages(cache, keys, values, valid, pool_mesh)

        return self._layers(tokens, positions, attention, weights_mesh, backend, packed_weights=packed_weights,
                            write_kv=write)

    def _layers(self, tokens, positions, attention, mesh, backend, *, cache=None, cache_index=None,
                packed_weights=None, write_kv=None):
        """Embedding, the layer scan (or, over `LayerWeights`, the layers one after the other) and the final norm:
        (hidden [B, T, E], the updated cache or None).

        `attention(sliding, layer)` gives a layer's `attend(q, k, v)` (`Attention.__call__`'s) from whether that
        layer slides and its index (traced); with `cache`, the layers' new keys and values are written at
        `cache_index`; with `write_kv`, they ([L, B, T, kv, D] each) are handed to it and what it returns is the
        updated cache."""
        c = self.config
        rows = lambda y: constrain_activation(y, ("batch",) + (None,) * (y.ndim - 1), mesh)  # noqa: E731
        cos_full, sin_full = rope_tables(positions, rope_inverse_frequencies(c.rope, c.head_dim))
        cos_sliding, sin_sliding = rope_tables(positions, rope_inverse_frequencies(c.rope_sliding or c.rope, c.head_dim))
        cos_full, sin_full, cos_sliding, sin_sliding = jax.tree.map(rows, (cos_full, sin_full, cos_sliding, sin_sliding))
        forms = backend.memory

        with jax.named_scope("embed"):
            x = forms.take_rows(self.embed[...], tokens).astype(self.dtype)
            if c.is_gemma:
                x = x * jnp.asarray(c.embedding_scale, self.dtype)
        x = rows(x)

        graphdef, layer_params = nnx.split(self.layers)
        per_layer = packed_weights if isinstance(packed_weights, LayerWeights) else None

        def layer(x, inputs):
            params, index, sliding = inputs
            if per_layer is None:
                params = forms.layer_weights(params, layer_params, index,
                                             packed_weights.layers if packed_weights else None)
            block = nnx.merge(graphdef, params)
            cos = jnp.where(sliding, cos_sliding, cos_full)
            sin = jnp.where(sliding, sin_sliding, sin_full)
            x, new_kv = block(x, cos, sin, attention(sliding, index), forms, mesh)
            return x, (None if cache is None and write_kv is None else new_kv)

        if self.remat:
            # Layers run one after another: without barriers XLA would merge each recomputation with the forward
            # it repeats (the same operations on the same inputs), undoing the remat.
            layer = checkpointed(layer, "full" if self.remat is True else self.remat,
                                 prevent_cse=per_layer is not None)
        # Every layer reads the whole cache and prefix (closed over, read-only) at its own index, so no layer's
        # slice is copied; the layers' new keys and values [L, B, T, ...] come out of the scan and are
        # written with one dynamic_update_slice each (in place when donated).
        stream = lambda y: constrain_activation(y, ("batch", "sequence", None), mesh)  # noqa: E731
        with jax.named_scope("layers"):
            if per_layer is None:
                layer_ids = jnp.arange(c.num_layers, dtype=jnp.int32)
                x, new_kv = jax.lax.scan(layer, stream(x),
                                         (layer_params, layer_ids, jnp.asarray(c.sliding_layer_mask)))
            else:  # weights split per layer before a decode loop (`memory_forms.split_layers`): one after another
                x, outputs = stream(x), []
                for index, params in enumerate(per_layer.layers):
                    x, kv = layer(x, (params, jnp.int32(index), bool(c.sliding_layer_mask[index])))
                    outputs.append(kv)
                new_kv = None if outputs[0] is None else jax.tree.map(lambda *kv: jnp.stack(kv), *outputs)
        if cache is not None:
            start = (0, 0, 0, cache_index, 0)
            heads_major = lambda x, like: jnp.swapaxes(x, 2, 3).astype(like.dtype)  # noqa: E731 [L, B, kv, T, D]
            with jax.named_scope("kv_cache_write"):
                cache = KVCache(forms.write_slots(cache.k, heads_major(new_kv[0], cache.k), start),
                                forms.write_slots(cache.v, heads_major(new_kv[1], cache.v), start))
        elif write_kv is not None:
            with jax.named_scope("kv_cache_write"):
                cache = write_kv(new_kv)
        return rows(self.final_norm(stream(x))), cache

    def __call__(self, tokens, positions=None, *, attention_mask=None, segment_ids=None, cache=None, cache_index=None,
                 kv_mask=None, prefix=None, prefix_mask=None, packed_weights=None):
        """Logits [B, T, V] float32; with `cache=`, `(logits, updated_cache)`."""
        hidden, new_cache = self._hidden_states(
            tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids,
            cache=cache, cache_index=cache_index, kv_mask=kv_mask, prefix=prefix, prefix_mask=prefix_mask,
            packed_weights=packed_weights,
        )
        logits = self.logits_from_hidden(hidden, packed_weights)
        return logits if cache is None else (logits, new_cache)

    def token_logprobs(
        self,
        tokens: jax.Array,
        targets: jax.Array,
        positions: jax.Array | None = None,
        *,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        temperature: float = 1.0,
        sequence_chunk: int | None = None,
        vocab_chunk: int = 8192,
    ) -> tuple[jax.Array, jax.Array]:
        """(log p(targets[b, t] | tokens[b, :t+1]), entropy) [B, T] each, chunked (see `logprobs`).

        `targets` is usually `tokens` shifted left by one; temperature divides the logits as in sampling.
        """
        hidden, _ = self._hidden_states(tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids)
        return token_logprobs_and_entropy(
            hidden, self.unembedding(), targets, temperature=temperature,
            logit_softcap=self.config.final_logit_softcapping, sequence_chunk=sequence_chunk, vocab_chunk=vocab_chunk,
        )
