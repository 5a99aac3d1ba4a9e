"""The sampling distribution: temperature, then top-k, top-p and min-p, or greedy (`SamplingParams`), each token's
log-prob under exactly the distribution it was drawn from, and per-row keys, so a row's draws depend on its
request id and position only: the rollout engine's draws."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxgrpo.models import backend
from jaxgrpo.sampler.requests import is_int_in


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
    if ids is None and params.min_p == 0.0:  # untruncated: the policy distribution is the sampling one
        tokens, logprobs = _draw_from_logits(keys, candidates)
        return tokens, logprobs, logprobs
    top = jnp.max(candidates, axis=-1, keepdims=True)
    weights = jnp.exp(candidates - top)  # unnormalized probabilities, 0 off the support
    blocks = _in_blocks(weights, 0.0)
    choice, total = _inverse_cdf(keys, blocks.sum(axis=-1), lambda b: _block(blocks, b))
    logprobs = _take(candidates, choice) - top[:, 0] - jnp.log(total)
    tokens = choice if ids is None else _take(ids, choice)
    return tokens.astype(jnp.int32), logprobs, _log_prob_of(logits / params.policy_temperature, tokens)


def _draw_from_logits(keys: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(one token per row drawn from softmax(logits) [R, V], its log-prob), the logits read once by each block's
    (maximum, sum of exponentials) in one reduction where the program's memory forms take one pass
    (`MemoryForms.online_softmax`, an accelerator's) and the blocks' masses rescaled to the largest maximum; only
    the drawn block's weights are computed again. Compiled for an H100, the engine's decode step (128 rows of
    Qwen3's 151,936 words) read the float32 logits four times (the maximum, the blocks' masses, the normalizer,
    the drawn block); now once."""
    lowest = jnp.finfo(jnp.float32).min  # finite padding: weight exp(lowest - top) = 0
    blocks = _in_blocks(logits, lowest)
    zeros = jnp.zeros(blocks.shape[:2], jnp.float32)
    block_max, block_sum = backend.memory_for_program().online_softmax((jnp.full(zeros.shape, lowest), zeros), blocks)
    top = block_max.max(axis=-1)
    mass = block_sum * jnp.exp(block_max - top[:, None])
    choice, total = _inverse_cdf(keys, mass, lambda b: jnp.exp(_block(blocks, b) - top[:, None]))
    return choice.astype(jnp.int32), _take(logits, choice) - top - jnp.log(total)


def _in_blocks(x: jax.Array, fill) -> jax.Array:
    """x [R, N] cut into [R, blocks, SAMPLING_BLOCK] (at most N a block), the last padded with `fill`."""
    rows, size = x.shape
    block = min(SAMPLING_BLOCK, size)
    num_blocks = -(-size // block)
    return jnp.pad(x, ((0, 0), (0, num_blocks * block - size)), constant_values=fill).reshape(rows, num_blocks, block)


def _block(blocks: jax.Array, b: jax.Array) -> jax.Array:
    """blocks[r, b[r]] [R, block] of `_in_blocks`' blocks [R, blocks, block]."""
    return jnp.take_along_axis(blocks, b[:, None, None], axis=1)[:, 0]


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[r, index[r]] for x [R, N] and index [R]."""
    return jnp.take_along_axis(x, index[:, None], axis=-1)[:, 0]


def _log_prob_of(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log_softmax(logits)[r, tokens[r]] without materializing the log-softmax."""
    return _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)


SAMPLING_BLOCK = 1024


def _inverse_cdf(keys: jax.Array, mass: jax.Array, weights_of) -> tuple[jax.Array, jax.Array]:
    """(one index per row drawn with probability proportional to its weight, the row's total weight), from the
    weights' block masses `mass` [R, blocks] (blocks of SAMPLING_BLOCK; one > 0 per row) and `weights_of(b)`, the
    [R, block] weights of block b[r] of each row (>= 0).

    Inverse-CDF sampling with a single uniform per row, in two levels so that no [R, N] prefix sum is
    needed: the CDF over blocks of SAMPLING_BLOCK weights picks a block, the CDF inside it the index.
    Gumbel-max (`jax.random.categorical`) would draw N random numbers per row, which at a 49k-token
    vocabulary costs more than the rest of the sampling step together. Rounding never makes it return
    an index of weight zero: the result is clipped to the first and last indices with weight.
    """
    cdf = jnp.cumsum(mass, axis=-1)
    u = jax.vmap(lambda key: jax.random.uniform(key, ()))(keys) * cdf[:, -1]

    def first_above(cdf, target, weight):  # the first index whose CDF exceeds target, kept among those with weight
        index = jnp.arange(weight.shape[-1])
        first = jnp.min(jnp.where(weight > 0, index, weight.shape[-1]), axis=-1)
        last = jnp.max(jnp.where(weight > 0, index, 0), axis=-1)
        return jnp.clip((cdf <= target[:, None]).sum(axis=-1), first, last)

    b = first_above(cdf, u, mass)
    inside = weights_of(b)  # [R, block]
    i = first_above(jnp.cumsum(inside, axis=-1), u - (_take(cdf, b) - _take(mass, b)), inside)
    return b * inside.shape[-1] + i, cdf[:, -1]


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
