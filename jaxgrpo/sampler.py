"""Batched generation with a KV cache: G completions per prompt from the policy being trained.

The sampler runs the same `flax.nnx` policy the trainer differentiates (split into graph and
state, merged inside `jax.jit`), so there is no weight copy and the log-probs it reports are the
ones the trainer recomputes (kvfrans/lmpo does the same).

How a batch of B prompts becomes B*G completions (`G = num_samples`, `P` the prompt bucket,
`N` the completion bucket, `C = P + N` the context capacity):

1. prompts are left-padded to `P`, the smallest power of two >= 16 holding the longest one;
   positions count real tokens, so padding changes nothing but the shapes;
2. **prefill** (one jitted call): the B prompts run once into a [layers, B, P, ...] prompt cache,
   stored once and shared by the prompt's G rows (row `b * G + g` is sample g of prompt b); the
   first completion token is sampled from the last prompt position's logits;
3. **decode** (one jitted call, the carry donated): a `lax.while_loop` feeds each row's last
   token at slot `t` of the rows' [layers, B*G, N, ...] completion cache, writing its keys and
   values with `dynamic_update_slice` in place, until every row has produced a stop token or
   `max_new_tokens` tokens exist. Attention reads each prompt's keys once per step for its G rows
   (the decoder's `prefix=`): the prompt's cache is stored and read once instead of G times.

Sampling: temperature, then top-k, then top-p (nucleus, on the renormalized top-k distribution),
then min-p, in the order of transformers' `generate`; `greedy` takes the argmax. The log-prob
reported for each token is under exactly the distribution it was drawn from (truncated and
renormalized); `policy_logprobs` is the untruncated `log_softmax(logits / temperature)`, the
quantity a trainer recomputes. Randomness is per row: row `r = prompt_id * G + g` draws step t
with `fold_in(fold_in(key, r), t)`, so a row's sample does not depend on its batch companions.

Shapes are bucketed (prompt length and completion length to powers of two >= 16), so a run
compiles a bounded number of times; `compilation_counts()` reports how many.

Multi-host (`process_local=True`): each process passes only its own block of the batch's prompts
(`jaxgrpo.distributed.process_block`); the prompt bucket is agreed with a cross-process max of the longest prompt, the
padded prompts (small host arrays) are gathered so every process holds the whole batch's, and every
process runs the same program on the global batch; the returned rows are global arrays, this
process's block on its own devices (`process_sharding`, `jax.make_array_from_process_local_data`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo.distributed import global_rows
from jaxgrpo.models import backend as backends, partitioning
from jaxgrpo.models.decoder import mask_positions

logger = logging.getLogger(__name__)

FINISH_STOP = 1
"""`finish_reason` of a row that produced one of the stop tokens (the stop token is kept, masked in)."""
FINISH_LENGTH = 2
"""`finish_reason` of a row that reached `max_new_tokens` without a stop token."""

MIN_BUCKET = 16

_COMPILATIONS: collections.Counter = collections.Counter()


def compilation_counts() -> dict[str, int]:
    """How many times each jitted sampler function was traced and compiled in this process.

    Keys are `"prefill"` and `"decode"`; each distinct (batch, prompt bucket, completion bucket,
    sampling settings, model) adds one to both.
    """
    return dict(_COMPILATIONS)


# ---------------------------------------------------------------------------------------------
# Sampling distribution


def is_int_in(value, low: int, high: int | None = None) -> bool:
    """Whether `value` is an integer (Python or NumPy; not a bool) in [low, high] (no upper bound without `high`):
    the check of every count and index argument of the sampler and the engine."""
    return (not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= low
            and (high is None or value <= high))


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn from the logits. Hashable: it is a static argument of the jitted loop.

    Attributes:
      temperature: logits are divided by it before anything else; must be > 0 unless greedy
        (0 means greedy).
      top_k: keep the k most likely tokens (0 disables).
      top_p: nucleus sampling, keep the smallest prefix of the sorted distribution whose mass
        reaches top_p ("The Curious Case of Neural Text Degeneration", Holtzman et al. 2020);
        in (0, 1], 1 disables.
      min_p: keep tokens whose probability is at least min_p times the most likely one's
        ("Turning Up the Heat: Min-p Sampling", Nguyen et al. 2024); in [0, 1), 0 disables.
      greedy: take the argmax (the sampling distribution is then a point mass, log-prob 0).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    greedy: bool = False

    def __post_init__(self):
        temperature, top_p, min_p = float(self.temperature), float(self.top_p), float(self.min_p)
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not is_int_in(self.top_k, 0):
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if not 0.0 <= min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1) (0 disables it), got {self.min_p}")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "min_p", min_p)
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "greedy", bool(self.greedy) or temperature == 0.0)

    @property
    def policy_temperature(self) -> float:
        """The temperature of `policy_logprobs`: `temperature`, or 1 when greedy with temperature 0."""
        return self.temperature if self.temperature > 0 else 1.0


def _truncated_candidates(scaled_logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array | None]:
    """The support of the sampling distribution, as logits over candidates.

    Args:
      scaled_logits: float32 [..., V], logits already divided by the temperature.

    Returns:
      `(candidate_logits [..., K], candidate_ids [..., K] or None)`: logits of the candidates,
      -inf where a filter removed them. With top-k or top-p the candidates are the top K tokens
      sorted by descending logit (K = top_k, or V for top-p alone) and `candidate_ids` maps them
      back to token ids; otherwise the candidates are the whole vocabulary (ids None).
    """
    vocab = scaled_logits.shape[-1]
    candidate_ids = None
    logits = scaled_logits
    if params.top_k or params.top_p < 1.0:
        k = min(params.top_k, vocab) if params.top_k else vocab
        logits, candidate_ids = jax.lax.top_k(scaled_logits, k)
    if params.top_p < 1.0:
        # Sorted descending: keep a token while the mass strictly before it is below top_p,
        # so the most likely token always stays.
        probs = jax.nn.softmax(logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        logits = jnp.where(mass_before < params.top_p, logits, -jnp.inf)
    if params.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  logit_i - max_logit >= log(min_p); renormalization-invariant.
        max_logit = jnp.max(logits, axis=-1, keepdims=True)
        logits = jnp.where(logits - max_logit >= math.log(params.min_p), logits, -jnp.inf)
    return logits, candidate_ids


def sampling_log_probs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Log-probabilities [..., V] of the distribution the sampler draws from (-inf off its support).

    The reference for `sample_tokens`: temperature, top-k, top-p, min-p applied to `logits`
    [..., V] and renormalized; for greedy, a point mass on the argmax (log-prob 0).
    """
    logits = jnp.asarray(logits, jnp.float32)
    if params.greedy:
        best = jnp.argmax(logits, axis=-1)
        return jnp.where(jnp.arange(logits.shape[-1]) == best[..., None], 0.0, -jnp.inf)
    candidates, ids = _truncated_candidates(logits / params.temperature, params)
    log_probs = jax.nn.log_softmax(candidates, axis=-1)
    if ids is None:
        return log_probs
    full = jnp.full(logits.shape, -jnp.inf, jnp.float32)
    return jnp.put_along_axis(full, ids, log_probs, axis=-1, inplace=False)


@jax.named_scope("sampling")
def sample_tokens(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draw one token per row.

    Args:
      keys: [R] PRNG keys, one per row (row r's draw depends only on keys[r] and logits[r]).
      logits: float [R, V].
      params: the sampling distribution.

    Returns:
      `(tokens int32[R], logprobs float32[R], policy_logprobs float32[R])`: the tokens, their
      log-prob under the distribution they were drawn from (`sampling_log_probs`), and their
      untruncated log-prob `log_softmax(logits / policy_temperature)`.
    """
    logits = jnp.asarray(logits, jnp.float32)
    if params.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return tokens, jnp.zeros(tokens.shape, jnp.float32), _log_prob_of(logits / params.policy_temperature, tokens)
    candidates, ids = _truncated_candidates(logits / params.temperature, params)
    top = jnp.max(candidates, axis=-1, keepdims=True)
    weights = jnp.exp(candidates - top)  # unnormalized probabilities, 0 off the support
    choice = _inverse_cdf(keys, weights)
    logprobs = _take(candidates, choice) - top[:, 0] - jnp.log(weights.sum(axis=-1))
    tokens = choice if ids is None else _take(ids, choice)
    tokens = tokens.astype(jnp.int32)
    if ids is None and params.min_p == 0.0:  # untruncated: the policy distribution is the sampling one
        return tokens, logprobs, logprobs
    return tokens, logprobs, _log_prob_of(logits / params.policy_temperature, tokens)


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[r, index[r]] for x [R, N] and index [R]."""
    return jnp.take_along_axis(x, index[:, None], axis=-1)[:, 0]


def _log_prob_of(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log_softmax(logits)[r, tokens[r]] without materializing the log-softmax."""
    return _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)


SAMPLING_BLOCK = 1024


def _inverse_cdf(keys: jax.Array, weights: jax.Array) -> jax.Array:
    """One index per row drawn with probability proportional to `weights` [R, N] (>= 0, one > 0 per row).

    Inverse-CDF sampling with a single uniform per row, in two levels so that no [R, N] prefix sum is
    needed: the CDF over blocks of SAMPLING_BLOCK weights picks a block, the CDF inside it the index.
    Gumbel-max (`jax.random.categorical`) would draw N random numbers per row, which at a 49k-token
    vocabulary costs more than the rest of the sampling step together. Rounding never makes it return
    an index of weight zero: the result is clipped to the first and last indices with weight.
    """
    rows, size = weights.shape
    block = min(SAMPLING_BLOCK, size)
    num_blocks = -(-size // block)
    weights = jnp.pad(weights, ((0, 0), (0, num_blocks * block - size))).reshape(rows, num_blocks, block)
    mass = weights.sum(axis=-1)  # [R, blocks]
    cdf = jnp.cumsum(mass, axis=-1)
    u = jax.vmap(lambda key: jax.random.uniform(key, ()))(keys) * cdf[:, -1]

    def first_above(cdf, target, weight):  # the first index whose CDF exceeds target, kept among those with weight
        index = jnp.arange(weight.shape[-1])
        first = jnp.min(jnp.where(weight > 0, index, weight.shape[-1]), axis=-1)
        last = jnp.max(jnp.where(weight > 0, index, 0), axis=-1)
        return jnp.clip((cdf <= target[:, None]).sum(axis=-1), first, last)

    b = first_above(cdf, u, mass)
    inside = jnp.take_along_axis(weights, b[:, None, None], axis=1)[:, 0]  # [R, block]
    i = first_above(jnp.cumsum(inside, axis=-1), u - (_take(cdf, b) - _take(mass, b)), inside)
    return b * block + i


def row_keys(key: jax.Array, prompt_ids: jax.Array, num_samples: int) -> jax.Array:
    """One PRNG key per completion row: row `b * G + g` gets `fold_in(key, prompt_ids[b] * G + g)`.

    Args:
      key: a PRNG key (typed or raw uint32).
      prompt_ids: int [B], a stable id per prompt (its index in the dataset, say), so a prompt's
        samples do not depend on which batch or position it lands in.
      num_samples: G.

    Returns:
      [B * G] keys.
    """
    ids = (jnp.asarray(prompt_ids, jnp.int32)[:, None] * num_samples + jnp.arange(num_samples, dtype=jnp.int32)).reshape(-1)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)


def step_keys(keys: jax.Array, step: jax.Array | int) -> jax.Array:
    """The keys [R] rows draw their `step`-th token with: `fold_in(keys[r], step)`."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)


# ---------------------------------------------------------------------------------------------
# Shapes


def bucket_length(length: int, minimum: int = MIN_BUCKET) -> int:
    """The static size a length is padded to: the smallest power of two >= max(length, minimum)."""
    length = max(int(length), int(minimum), 1)
    return 1 << (length - 1).bit_length()


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token id lists to `length`: `(tokens int32[B, length], mask bool[B, length])`."""
    tokens = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            tokens[row, length - len(prompt):] = prompt
            mask[row, length - len(prompt):] = True
    return tokens, mask


def _check_prompts(prompts, vocab_size: int, context_window: int | None, max_new_tokens: int = 0) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) and not isinstance(prompts, np.ndarray):
        raise TypeError(f"prompts must be a list of token id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; pass at least one prompt")
    checked = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            raise TypeError(f"prompts[{i}] is a string; tokenize it first or use generate_text")
        ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
        if not ids:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token (e.g. BOS)")
        if context_window is not None and len(ids) + max_new_tokens > context_window:
            # Positions past the window mean nothing to the model: its rows would run on garbage, silently.
            from jaxgrpo.errors import ConfigError

            raise ConfigError(
                f"prompts[{i}] has {len(ids)} tokens, and with max_new_tokens={max_new_tokens} its row needs "
                f"{len(ids) + max_new_tokens} positions, more than the model's context window of {context_window} "
                f"(context_window); truncate the prompt or lower max_new_tokens"
                + (f" (to at most {context_window - len(ids)})" if context_window > len(ids) else "")
            )
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab_size}): min {low}, max {high}")
        checked.append(ids)
    return checked


# ---------------------------------------------------------------------------------------------
# The jitted prefill and decode


class Generation(NamedTuple):
    """What `generate` returns; rows are prompt-major (row `b * G + g` is sample g of prompt b).

    Attributes:
      prompt_tokens: int32 [B*G, P], the left-padded prompts actually used (P the prompt bucket).
      prompt_mask: bool [B*G, P], True on real prompt tokens.
      completion_tokens: int32 [B*G, N] (N = max_new_tokens), `pad_id` after a row finished.
      completion_mask: bool [B*G, N], True on generated tokens, the stop token included.
      logprobs: float32 [B*G, N], log-prob of each token under the exact distribution it was
        sampled from (after temperature and truncation; 0 for greedy), 0 where masked out.
      policy_logprobs: float32 [B*G, N], `log_softmax(logits / temperature)` of each token, no
        truncation: what a trainer recomputes on the same sequences; 0 where masked out.
      finish_reason: int32 [B*G], `FINISH_STOP` or `FINISH_LENGTH`.
      prompt_index: int32 [B*G], the index of each row's prompt in the batch (the group id).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    finish_reason: jax.Array
    prompt_index: jax.Array


class _DecodeState(NamedTuple):
    """The while-loop carry. `step` tokens have been generated (buffer columns [0, step))."""

    step: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    done: jax.Array
    finish_reason: jax.Array
    prompt_lengths: jax.Array
    kv_mask: jax.Array  # bool[B*G, N] the completion slots written so far
    keys: jax.Array
    cache: Any  # the rows' completion keys and values, KVCache [L, B*G, kv, N, D] (as the memory forms carry it)
    prompt_cache: Any  # each prompt's keys and values, stored once: KVCache [L, B, kv, P, D] (likewise)
    prompt_mask: jax.Array  # bool[B, P]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static shapes and shardings of one compiled sampler."""

    num_samples: int
    prompt_bucket: int
    new_bucket: int
    sampling: SamplingParams
    mesh: jax.sharding.Mesh | None = None
    batch_axes: tuple[str, ...] = ()  # mesh axes the batch (rows) is split over
    kv_heads_axes: Any = None  # the cache's kv-heads entry of the PartitionSpec

    @property
    def capacity(self) -> int:
        return self.prompt_bucket + self.new_bucket

    def constrain(self, x: jax.Array, *spec) -> jax.Array:
        """Shard x's leading dims as `spec` on the mesh, where the mesh axes divide them."""
        if self.mesh is None:
            return x

        def fits(entry, size):
            axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
            return entry if axes and size % math.prod(self.mesh.shape[a] for a in axes) == 0 else None

        spec = tuple(fits(entry, x.shape[i]) for i, entry in enumerate(spec))
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def constrain_rows(self, x: jax.Array) -> jax.Array:
        """Split the leading (row) axis over the batch axes."""
        return self.constrain(x, self.batch_axes or None)

    def constrain_cache(self, cache):
        """Cache leaves are [layers, batch, kv_heads, capacity, head_dim]: batch over data, heads over model."""
        return jax.tree.map(lambda x: self.constrain(x, None, self.batch_axes or None, self.kv_heads_axes), cache)


def layout_for(model, mesh, num_samples: int, prompt_bucket: int, new_bucket: int, sampling: SamplingParams) -> Layout:
    """Rows over the mesh's `data`/`fsdp` axes, the cache's kv heads as the model's rules shard them."""
    if mesh is None:
        return Layout(num_samples, prompt_bucket, new_bucket, sampling)
    if "data" not in mesh.axis_names:
        raise ValueError(f"mesh must have a 'data' axis to shard the batch over, got axes {mesh.axis_names}")
    batch_axes = tuple(a for a in ("data", "fsdp") if a in mesh.axis_names)
    heads = partitioning.logical_to_mesh_spec(("kv_heads",), (model.config.num_kv_heads,), mesh)[0]
    return Layout(num_samples, prompt_bucket, new_bucket, sampling, mesh, batch_axes, heads)


def _is_done(tokens: jax.Array, stop_tokens: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_tokens[None, :], axis=-1)


def prefill(graphdef, state, prompt_tokens, prompt_mask, keys, stop_tokens, max_new_tokens, pad_id, *, layout: Layout):
    """Run the B prompts once into the prompt cache their G samples share, sample each row's first token.

    prompt_tokens/prompt_mask [B, P]; keys [B*G]; stop_tokens int32 [S]; returns a `_DecodeState`
    with step 1, the prompt cache and an empty completion cache of capacity N.
    """
    _COMPILATIONS["prefill"] += 1
    batch, prompt_len = prompt_tokens.shape
    g, n = layout.num_samples, layout.new_bucket
    logger.info("compiling sampler prefill: batch=%d x %d samples, prompt bucket %d, completion bucket %d", batch, g, prompt_len, n)
    model = nnx.merge(graphdef, state)
    prompt_tokens = layout.constrain_rows(prompt_tokens)
    prompt_mask = layout.constrain_rows(prompt_mask)
    positions = mask_positions(prompt_mask)
    cache = layout.constrain_cache(model.init_cache(batch, prompt_len))
    hidden, prompt_cache = model.decode_step(prompt_tokens, positions, cache=cache, cache_index=0, kv_mask=prompt_mask)
    # Left padding puts every prompt's last token in the last column.
    last_logits = model.logits_from_hidden(hidden[:, -1])
    last_logits = layout.constrain_rows(jnp.repeat(last_logits, g, axis=0))

    rows = batch * g
    tokens, logprobs, policy_logprobs = sample_tokens(step_keys(keys, 0), last_logits, layout.sampling)
    done = _is_done(tokens, stop_tokens)

    def first_column(x, fill):
        return layout.constrain_rows(jnp.full((rows, n), fill, x.dtype).at[:, 0].set(x))

    forms = backends.memory_for_program()
    return _DecodeState(
        step=jnp.int32(1),
        tokens=first_column(tokens, pad_id),
        logprobs=first_column(logprobs, 0.0),
        policy_logprobs=first_column(policy_logprobs, 0.0),
        lengths=jnp.ones((rows,), jnp.int32),
        done=done | (max_new_tokens <= 1),
        finish_reason=jnp.where(done, FINISH_STOP, 0).astype(jnp.int32),
        prompt_lengths=jnp.repeat(prompt_mask.sum(axis=1, dtype=jnp.int32), g),
        kv_mask=layout.constrain_rows(jnp.zeros((rows, n), bool)),
        keys=keys,
        cache=forms.to_carry(layout.constrain_cache(model.init_cache(rows, n))),
        prompt_cache=forms.to_carry(layout.constrain_cache(prompt_cache)),
        prompt_mask=prompt_mask,
    )


def decode_loop(graphdef, state, carry: _DecodeState, stop_tokens, max_new_tokens, pad_id, *, layout: Layout) -> _DecodeState:
    """The decode `lax.while_loop`: one token per row per iteration until all rows are done.

    Iteration t feeds token t-1 at completion-cache slot t - 1 (position prompt_length + t - 1) and
    samples token t; finished rows keep running (static shapes) but record `pad_id`, masked out.
    The carry (cache included) is donated, so XLA updates it in place.
    """
    _COMPILATIONS["decode"] += 1
    logger.info(
        "compiling sampler decode: %d rows, prompt bucket %d, completion bucket %d (cache capacity %d)",
        carry.tokens.shape[0], layout.prompt_bucket, layout.new_bucket, layout.capacity,
    )
    model = nnx.merge(graphdef, state)
    rows = carry.tokens.shape[0]
    # On CPU, bfloat16 weights packed once for the one-token products (cpu_matmul); None elsewhere.
    packed_weights = model.pack_weights()
    forms = backends.memory_for_program()

    def keep_going(s: _DecodeState):
        return (s.step < max_new_tokens) & ~jnp.all(s.done)

    def one_token(s: _DecodeState) -> _DecodeState:
        previous = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)
        slot = s.step - 1
        kv_mask = jax.lax.dynamic_update_slice(s.kv_mask, jnp.ones((rows, 1), bool), (0, slot))
        positions = (s.prompt_lengths + s.step - 1)[:, None]
        # The caches ride the loop as the memory forms carry them (on a CPU, a bfloat16 cache as its bits:
        # no whole-cache copy per step on XLA:CPU).
        hidden, cache = model.decode_step(previous, positions, cache=forms.from_carry(s.cache, model.dtype),
                                          cache_index=slot, kv_mask=kv_mask,
                                          prefix=forms.from_carry(s.prompt_cache, model.dtype),
                                          prefix_mask=s.prompt_mask, packed_weights=packed_weights)
        logits = model.logits_from_hidden(hidden[:, 0], packed_weights)
        cache = forms.to_carry(layout.constrain_cache(cache))
        tokens, logprobs, policy_logprobs = sample_tokens(step_keys(s.keys, s.step), logits, layout.sampling)
        live = ~s.done
        stopped = live & _is_done(tokens, stop_tokens)

        def write(buffer, column, fill):
            column = jnp.where(live, column, fill).astype(buffer.dtype)
            return jax.lax.dynamic_update_slice(buffer, column[:, None], (0, s.step))

        return _DecodeState(
            step=s.step + 1,
            tokens=write(s.tokens, tokens, pad_id),
            logprobs=write(s.logprobs, logprobs, 0.0),
            policy_logprobs=write(s.policy_logprobs, policy_logprobs, 0.0),
            lengths=s.lengths + live.astype(jnp.int32),
            done=s.done | stopped | (s.step + 1 >= max_new_tokens),
            finish_reason=jnp.where(stopped, FINISH_STOP, s.finish_reason),
            prompt_lengths=s.prompt_lengths,
            kv_mask=kv_mask,
            keys=s.keys,
            cache=cache,
            prompt_cache=s.prompt_cache,
            prompt_mask=s.prompt_mask,
        )

    final = jax.lax.while_loop(keep_going, one_token, carry)
    return final._replace(finish_reason=jnp.where(final.finish_reason == FINISH_STOP, FINISH_STOP, FINISH_LENGTH))


# The two compiled programs of `generate`, public for what lowers or replays them (`jaxgrpo.compile`, benchmarks).
prefill_program = jax.jit(prefill, static_argnames=("graphdef", "layout"))
decode_program = jax.jit(decode_loop, static_argnames=("graphdef", "layout"), donate_argnames=("carry",))


def stop_array(stop_tokens: Sequence[int]) -> np.ndarray:
    """The stop set as int32 [S], S a power of two >= 8 padded with -1 (never a token), so
    changing the stop set does not recompile."""
    stop = sorted({int(t) for t in stop_tokens})
    out = np.full(bucket_length(len(stop), 8), -1, np.int32)
    out[: len(stop)] = stop
    return out


def _run(graphdef, state, prompt_tokens, prompt_mask, keys, stop_tokens, max_new_tokens: int, pad_id: int, layout: Layout) -> _DecodeState:
    """Prefill then decode with a given layout (`generate` without the checks; benchmarks use it
    to pick the cache capacity). Returns the final loop state; its buffers hold `layout.new_bucket` columns."""
    stop = stop_array(stop_tokens)
    limit, pad = jnp.int32(max_new_tokens), jnp.int32(pad_id)
    carry = prefill_program(graphdef, state, prompt_tokens, prompt_mask, keys, stop, limit, pad, layout=layout)
    return decode_program(graphdef, state, carry, stop, limit, pad, layout=layout)


# ---------------------------------------------------------------------------------------------
# Public entry points


def _mesh_of(state) -> jax.sharding.Mesh | None:
    """The mesh the policy's parameters live on, if they are sharded over more than one device."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def model_context_window(model, context_window: int | None = None) -> int | None:
    """`context_window` if given, else the model's (its config's `max_position_embeddings`, `context_window`
    or `max_seq_len`), else None (unknown: not checked)."""
    if context_window is not None:
        return int(context_window)
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "context_window", "max_seq_len"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return None


def _checked_request(model, prompts, num_samples, max_new_tokens, key, sampling: SamplingParams, prompt_ids, pad_id,
                     context_window):
    """`generate`'s arguments checked, each error one line: (prompts as token lists, i32[B] prompt ids, the key)."""
    if not is_int_in(num_samples, 1):
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    if not is_int_in(max_new_tokens, 1):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if key is None:
        if not sampling.greedy:
            raise ValueError("key is required to sample (pass jax.random.key(seed)), or set greedy=True")
        key = jax.random.key(0)
    vocab_size = model.config.vocab_size
    prompts = _check_prompts(prompts, vocab_size, model_context_window(model, context_window), int(max_new_tokens))
    if prompt_ids is None:
        prompt_ids = np.arange(len(prompts), dtype=np.int32)
    prompt_ids = np.asarray(prompt_ids, np.int32).reshape(-1)
    if prompt_ids.shape[0] != len(prompts):
        raise ValueError(f"prompt_ids has {prompt_ids.shape[0]} entries but there are {len(prompts)} prompts")
    if not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id}")
    return prompts, prompt_ids, key


def generate(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    key: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    greedy: bool = False,
    stop_tokens: Sequence[int] = (),
    prompt_ids: Sequence[int] | None = None,
    pad_id: int = 0,
    context_window: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    process_local: bool = False,
) -> Generation:
    """Sample `num_samples` completions for each prompt with a KV cache.

    Args:
      model: the policy, a `flax.nnx` decoder with `init_cache`, `decode_step`,
        `logits_from_hidden` and the cached call contract of `jaxgrpo.models.decoder`.
      prompts: B token id lists of any lengths (each non-empty).
      num_samples: G >= 1 completions per prompt.
      max_new_tokens: N >= 1, the most tokens a completion may have.
      key: PRNG key; required unless greedy.
      temperature, top_k, top_p, min_p, greedy: the sampling distribution (see `SamplingParams`).
      stop_tokens: token ids that end a completion (e.g. EOS and `<|im_end|>`); the stop token
        is part of the completion.
      prompt_ids: int [B], a stable id per prompt for its PRNG stream (default 0..B-1); pass
        dataset indices to make samples independent of batching.
      pad_id: token written after a row finished and used to left-pad prompts.
      context_window: the most positions a row may use, prompt plus `max_new_tokens` (default: the
        model config's `max_position_embeddings` if it has one).
      mesh: a mesh with `data` (and optionally `model`) axes to shard rows over (default: the
        mesh of the model's parameters, if they are sharded).
      process_local: in a multi-process run, `prompts` and `prompt_ids` are only this process's
        `process_block` of a batch of `B * process_count` prompts (every process passes as many);
        the others pass theirs. No effect where the model's mesh is one process's devices.

    Returns:
      A `Generation` with B*G rows (with `process_local`, global arrays of all processes' rows,
      this process's block on its own devices; `jaxgrpo.distributed.local_rows` copies it to the host).
    """
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, greedy=greedy)
    prompts, prompt_ids, key = _checked_request(model, prompts, num_samples, max_new_tokens, key, sampling, prompt_ids,
                                                pad_id, context_window)
    graphdef, state = nnx.split(model)
    mesh = mesh if mesh is not None else _mesh_of(state)
    # Rows are exchanged only where the model's mesh spans processes; on one process's devices its prompts are
    # all the program sees (e.g. each process's own sampler, multi-process one-step-off).
    distributed = process_local and mesh is not None and len({d.process_index for d in mesh.devices.flat}) > 1
    longest = max(len(p) for p in prompts)
    if distributed:  # one prompt bucket on every process, so all compile the same program
        longest = int(np.max(multihost_utils.process_allgather(np.int32(longest))))
    prompt_bucket = bucket_length(longest)
    layout = layout_for(model, mesh, num_samples, prompt_bucket, bucket_length(max_new_tokens), sampling)
    tokens, mask = left_pad(prompts, prompt_bucket, pad_id)
    if distributed:
        # The generation's prompt rows: this process's block of the global [B*G, P] arrays, on its own devices.
        row_tokens, row_mask = (global_rows(np.repeat(x, num_samples, axis=0), mesh) for x in (tokens, mask))
        # The sampler's inputs: every process's prompts (small host arrays), as a single process has them,
        # so every process runs the program (and gets the numbers) of one process with the same devices.
        tokens, mask, prompt_ids = multihost_utils.process_allgather((tokens, mask.astype(np.int32), prompt_ids), tiled=True)
        mask = np.asarray(mask).astype(bool)  # gathered as int32
    else:
        row_tokens, row_mask = (jnp.repeat(jnp.asarray(x), num_samples, axis=0) for x in (tokens, mask))
    keys = row_keys(key, prompt_ids, num_samples)
    final = _run(graphdef, state, tokens, mask, keys, stop_tokens, max_new_tokens, pad_id, layout)

    n = max_new_tokens
    return Generation(
        prompt_tokens=row_tokens, prompt_mask=row_mask, completion_tokens=final.tokens[:, :n],
        completion_mask=jnp.arange(n) < final.lengths[:, None], logprobs=final.logprobs[:, :n],
        policy_logprobs=final.policy_logprobs[:, :n], finish_reason=final.finish_reason,
        prompt_index=jnp.repeat(jnp.arange(len(prompt_ids), dtype=jnp.int32), num_samples),  # every process's
    )


def default_stop_tokens(tokenizer) -> list[int]:
    """The tokenizer's EOS plus the end-of-turn markers of common chat templates it knows."""
    stop = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        stop.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
        if marker in vocab:
            stop.add(int(vocab[marker]))
    return sorted(stop)


def encode_prompts(tokenizer, prompts, *, chat_template: bool | None = None) -> list[list[int]]:
    """Token ids of each prompt: a string or a list of chat messages (`{"role", "content"}` dicts).

    With the chat template (the default when the tokenizer has one) a string is a single user
    turn and the template's generation prompt is appended; without it a string is encoded as is.
    """
    has_template = getattr(tokenizer, "chat_template", None) is not None
    use_template = has_template if chat_template is None else chat_template
    encoded = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) and not use_template:
            encoded.append(list(tokenizer(prompt)["input_ids"]))
            continue
        if not has_template:
            raise ValueError(f"prompts[{i}] needs a chat template but the tokenizer has none; pass chat_template=False and strings")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        encoded.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return encoded


def generate_text(
    model: nnx.Module,
    tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[dict]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    seed: int = 0,
    chat_template: bool | None = None,
    stop_tokens: Sequence[int] | None = None,
    skip_special_tokens: bool = True,
    **sampling,
) -> list[list[str]]:
    """Generate from text prompts and decode: `result[b][g]` is completion g of prompt b.

    Args:
      model, tokenizer: as returned by `jaxgrpo.models.load`.
      prompts: strings, or conversations (lists of `{"role": ..., "content": ...}` messages).
      num_samples, max_new_tokens: as in `generate`.
      seed: PRNG seed of the sampling (ignored when greedy).
      chat_template: apply the tokenizer's chat template (default: when it has one).
      stop_tokens: default `default_stop_tokens(tokenizer)` (EOS, `<|im_end|>`, ...).
      skip_special_tokens: drop special tokens (the stop token among them) from the text.
      **sampling: `temperature`, `top_k`, `top_p`, `min_p`, `greedy` and the other keyword
        arguments of `generate`.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of strings or conversations, got a single string; wrap it in a list")
    token_prompts = encode_prompts(tokenizer, prompts, chat_template=chat_template)
    rollout = generate(
        model, token_prompts, num_samples=num_samples, max_new_tokens=max_new_tokens, key=jax.random.key(seed),
        stop_tokens=default_stop_tokens(tokenizer) if stop_tokens is None else stop_tokens,
        pad_id=sampling.pop("pad_id", tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0), **sampling,
    )
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    texts = [tokenizer.decode(row[keep].tolist(), skip_special_tokens=skip_special_tokens) for row, keep in zip(tokens, mask)]
    return [texts[b * num_samples:(b + 1) * num_samples] for b in range(len(token_prompts))]
