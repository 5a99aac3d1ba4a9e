"""The rollout engine: requests in, completions out, through decode slots over a paged KV cache.

    engine = Engine(model, num_slots=128, key=jax.random.key(0))
    completions = engine.generate([Request(id=i, prompt=p, max_new_tokens=256, stop_tokens=(eos,)) for ...])

**Continuous batching.** A request waits in a queue until a decode slot and enough blocks are free; the engine
then prefills it (one compiled program for all requests admitted together), and every decode slot advances
one token per step. A row that stops (a stop token, or its token budget) leaves its slot at the end of the
current chunk of steps and the next request takes it, so 1024 requests through 128 slots do not wait for the
slowest row of each batch of 128. A chunk ends after `decode_chunk` steps, or early once enough rows have
finished while requests wait.

**Prefix sharing.** Requests admitted together with the same prompt (the G samples of a GRPO group) run the
prompt once: they hold its full blocks together and each gets its own copy of the last, partial block
(copy-on-write), where its own tokens go. A prompt admitted later shares the blocks live sequences hold for
its leading tokens and runs only the rest; a decode chunk reads a prompt once for all its samples admitted
together that still run (the decoder's shared prefix, `plan_prefix_rows`).

**The session API** (multi-turn): `prefill(requests)` admits requests now and samples each one's first token;
`decode()` runs steps until every live sequence has stopped; `extend(id, tokens)` appends tokens a policy did
not sample (a tool's output, the next user turn) to a stopped sequence, runs them through the model from its
cache and samples the next token; `release(id)` frees the slot and blocks and returns the `Completion`.
`generate` is their composition with a queue.

**What each token carries.** A sampled token comes with its log-prob under the distribution it was drawn from
(after temperature, top-k, top-p, min-p: the behaviour policy), its untruncated log-prob
`log_softmax(logits / temperature)` (what a trainer recomputes) and the engine's policy `version` when it
was drawn. `update_weights(model)` swaps the weights in place (no copy) and bumps the version.

**Randomness.** The token at position p of request `id` is drawn with `fold_in(fold_in(key, id), p - o)`, `o`
its request's `draw_origin`: it does not depend on the slot, the admission order, the slot count or the
other rows, so the same requests give the same tokens however they are scheduled, wherever the logits agree.
With `o` the prompt's length (as `generate_groups` sets it), draw t of sample g of prompt b is keyed by
`sampler.row_keys` and `sampler.step_keys`: by the prompt's id, g and t alone.

Everything runs through the decoder's cached call (`Decoder.decode_step`) on dense views of the
blocks (`jaxgrpo.engine.paged`: each shared prefix once, each row's own positions), the XLA reference math
on every backend.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from flax import nnx

from jaxgrpo.distributed import batch_axes, batch_shards
from jaxgrpo.engine.blocks import NULL_BLOCK, BlockAllocator, blocks_for
from jaxgrpo.engine.programs import (
    STOP_SLOTS,
    SharedPrefixes,
    copy_program,
    decode_program,
    forward_program,
    init_pool,
    reads_pages_in_place,
)
from jaxgrpo.engine.sequences import Completion, LiveSequence, Request, plan_prefix_rows, prefix_key, token_list
from jaxgrpo.errors import ConfigError
from jaxgrpo.sampler.distribution import SamplingParams
from jaxgrpo.sampler.requests import bucket_length, is_int_in, model_context_window

logger = logging.getLogger(__name__)


class Engine:
    """Decode slots over a paged KV cache for one policy (see the module docstring).

    Args:
      model: the policy, a `jaxgrpo.models.Decoder` (or anything with its cached-call contract).
      num_slots: sequences decoded together (the decode batch).
      max_context: the most positions a sequence may use, prompt and every token after it (default: the
        model's context window, capped at 4096).
      block_size: positions per KV block.
      num_blocks: blocks in the pool, every shard's null block included (default: enough for every slot at
        `max_context`). Fewer blocks than that is the point of paging: the pool holds the tokens that live,
        and requests wait while it is full.
      key: the PRNG key of every draw (required unless every request is greedy).
      decode_chunk: decode steps per compiled call between scheduling decisions.
      refill: while requests wait, a decode chunk ends early once this many rows have finished (default
        `max(1, num_slots // 8)`), so freed slots are refilled promptly.
      mesh: a mesh with a `data` or `fsdp` axis: the slots and the pool's blocks are split over its row axes
        (`distributed.batch_axes`: both, as the decoder's activations split their rows), each row shard holding its
        slots' blocks (a sequence lives on one shard; block tables hold ids local to it), and the model's
        weights stay as placed. None: one device.
      in_place: whether decode chunks read the blocks in place (`Decoder.paged_decode_step`, through the attention's
        paged kernel, or its XLA reference where it has none) rather than through dense views gathered once a
        chunk; None (default): where the backend has a paged kernel (`programs.reads_pages_in_place`).
    """

    def __init__(self, model: nnx.Module, *, num_slots: int = 64, max_context: int | None = None, block_size: int = 16,
                 num_blocks: int | None = None, key: jax.Array | None = None, decode_chunk: int = 8,
                 refill: int | None = None, mesh: jax.sharding.Mesh | None = None, in_place: bool | None = None):
        for name, value in (("num_slots", num_slots), ("block_size", block_size), ("decode_chunk", decode_chunk)):
            if not is_int_in(value, 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if mesh is not None and not batch_axes(mesh):
            raise ValueError(f"the engine's mesh needs a 'data' or 'fsdp' axis to split its slots over; got axes "
                             f"{mesh.axis_names}")
        shards = batch_shards(mesh)
        if num_slots % shards:
            raise ConfigError(f"num_slots={num_slots} does not divide over the mesh's {shards} row shards (data x "
                              f"fsdp); use a multiple of {shards}")
        window = model_context_window(model)
        if max_context is None:
            max_context = min(window or 4096, 4096)
        if window is not None and max_context > window:
            raise ConfigError(f"max_context={max_context} exceeds the model's context window of {window}; lower it")
        self.num_slots, self.max_context, self.block_size = int(num_slots), int(max_context), int(block_size)
        self.context_window = window  # the model's (None: unbounded)
        self.mesh, self.num_shards = mesh, shards
        self.slots_per_shard = self.num_slots // shards
        self.max_blocks = blocks_for(self.max_context, self.block_size)
        if num_blocks is None:
            num_blocks = shards * (self.slots_per_shard * self.max_blocks + 1)
        if num_blocks % shards:
            raise ConfigError(f"num_blocks={num_blocks} does not divide over the mesh's {shards} row shards (data x "
                              f"fsdp); use a multiple of {shards}")
        self.allocators = [BlockAllocator(int(num_blocks) // shards, self.block_size) for _ in range(shards)]
        self.decode_chunk = int(decode_chunk)
        self.refill = max(1, self.num_slots // 8) if refill is None else int(refill)
        self._graphdef, self._state = nnx.split(model)
        self.config = model.config
        # Decode chunks read the blocks in place where the backend can (`programs.reads_pages_in_place`), else
        # through dense views of each chunk's width.
        self.reads_pages_in_place = reads_pages_in_place(model, mesh) if in_place is None else bool(in_place)
        self.cache = init_pool(model.config, int(num_blocks), self.block_size, model.dtype, mesh)
        self.key = jax.random.key(0) if key is None else key
        self._keyed = key is not None
        self.version = 0
        self._slots: list[LiveSequence | None] = [None] * self.num_slots
        self._sequences: dict[int, LiveSequence] = {}
        self._share = 1  # rows a decode chunk's shared prefix serves (`_chunk_rows`)
        self._groups = 0  # prompts prefilled so far: each one's samples are a prefix group (`LiveSequence.group`)
        # The full blocks of live prompts: (shard, the tokens of a prompt's first k blocks) -> its k-th block,
        # and back, so a prompt admitted later shares them (`_cached_blocks`) until they are freed.
        self._prompt_blocks: dict[tuple[int, tuple[int, ...]], int] = {}
        self._prompt_of_block: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}

    # -- weights ---------------------------------------------------------------------------------

    def update_weights(self, model_or_state: Any) -> int:
        """Sample from new weights from now on (a model, or its `nnx.split` state; same structure, no copy).
        Returns the new policy version. Live sequences keep the keys and values the old weights cached (an
        asynchronous trainer's off-policy tokens); a prompt admitted later runs in full under the new ones."""
        state = nnx.split(model_or_state)[1] if isinstance(model_or_state, nnx.Module) else model_or_state
        if jax.tree.structure(state) != jax.tree.structure(self._state):
            raise ValueError("update_weights needs the weights of the engine's model (same structure); got another tree")
        self._state = state
        self.version += 1
        # The blocks live sequences hold keep the old weights' keys: prompts admitted from now on do not share them.
        self._prompt_blocks.clear()
        self._prompt_of_block.clear()
        return self.version

    # -- bookkeeping -----------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return sum(1 for s in self._sequences.values() if s.running)

    @property
    def blocks_per_shard(self) -> int:
        """Blocks in each row shard's part of the pool, its null block included."""
        return self.allocators[0].num_blocks

    @property
    def blocks_in_use(self) -> int:
        """Blocks held by live sequences: KV memory in use is this times the block's bytes."""
        return sum(a.num_used for a in self.allocators)

    def _shard_of(self, slot: int) -> int:
        return slot // self.slots_per_shard

    def _free_slots(self, shard: int) -> list[int]:
        start = shard * self.slots_per_shard
        return [i for i in range(start, start + self.slots_per_shard) if self._slots[i] is None]

    def _worst_case_blocks(self, length: int, budget: int) -> int:
        return blocks_for(length + budget, self.block_size)

    def _unclaimed_blocks(self, shard: int) -> int:
        """Free blocks of `shard` that none of its live sequences may still claim for the tokens their budgets
        allow: what new requests or extensions there can have."""
        reserved = sum(max(0, self._worst_case_blocks(s.length + 1, s.remaining) - len(s.blocks))
                       for s in self._sequences.values() if s.running and s.shard == shard)
        return self.allocators[shard].num_free - reserved

    def _place(self, requests: Sequence[Request], prompts: Sequence[Sequence[int]]) -> list[int] | None:
        """A row shard for each request within the shards' free slots and unclaimed blocks, or None if they do
        not all fit. Requests with one prompt go to one shard while it has room (they share its blocks there)."""
        slots = [len(self._free_slots(d)) for d in range(self.num_shards)]
        blocks = [self._unclaimed_blocks(d) for d in range(self.num_shards)]
        home: dict[tuple[int, ...], int] = {}
        placed = []
        for request, prompt in zip(requests, prompts):
            need = self._worst_case_blocks(len(prompt), request.max_new_tokens)
            shard = home.get(tuple(prompt))
            if shard is None or slots[shard] < 1 or blocks[shard] < need:
                fitting = [d for d in range(self.num_shards) if slots[d] >= 1 and blocks[d] >= need]
                if not fitting:
                    return None
                # Where live sequences hold the most of its blocks (they are shared there), else the most free slots.
                shard = home[tuple(prompt)] = max(fitting, key=lambda d: (
                    len(self._cached_blocks(d, prompt)) if self.num_shards > 1 else 0, slots[d], -d))
            slots[shard] -= 1
            blocks[shard] -= need
            placed.append(shard)
        return placed

    def _check_request(self, request: Request) -> list[int]:
        if not isinstance(request, Request):
            raise TypeError(f"expected a Request, got {type(request).__name__}")
        prompt = token_list(request.prompt)
        budget = request.max_new_tokens
        if not prompt:
            raise ValueError(f"request {request.id}: the prompt is empty; every prompt needs at least one token")
        if min(prompt) < 0 or max(prompt) >= self.config.vocab_size:
            raise ValueError(f"request {request.id}: token ids outside [0, {self.config.vocab_size})")
        if not is_int_in(budget, 1):
            raise ValueError(f"request {request.id}: max_new_tokens must be an int >= 1, got {budget!r}")
        if len(prompt) + budget > self.max_context:
            raise ConfigError(f"request {request.id}: {len(prompt)} prompt tokens + max_new_tokens={budget} exceed the "
                              f"engine's context of {self.max_context}; shorten the prompt or lower max_new_tokens")
        need = self._worst_case_blocks(len(prompt), budget)
        if need > self.blocks_per_shard - 1:
            raise ConfigError(f"request {request.id}: needs {need} blocks of {self.block_size} but the cache has "
                              f"{self.blocks_per_shard - 1}{' per row shard' if self.num_shards > 1 else ''}; raise num_blocks or "
                              f"lower max_new_tokens")
        if not is_int_in(request.draw_origin, 0, len(prompt)):
            raise ValueError(f"request {request.id}: draw_origin must be an int in [0, {len(prompt)}] (the prompt's "
                             f"length at most), got {request.draw_origin!r}")
        if len(set(request.stop_tokens)) > STOP_SLOTS:
            raise ValueError(f"request {request.id}: at most {STOP_SLOTS} stop tokens, got {len(set(request.stop_tokens))}")
        if not request.sampling.greedy and not self._keyed:
            raise ValueError(f"request {request.id} samples (not greedy): create the Engine with key=jax.random.key(seed)")
        if request.id in self._sequences:
            raise ValueError(f"request id {request.id} is already in flight; ids must be unique among live sequences")
        return prompt

    def _tables(self, sequences: Sequence[LiveSequence | None]) -> np.ndarray:
        tables = np.full((len(sequences), self.max_blocks), NULL_BLOCK, np.int32)
        for row, sequence in enumerate(sequences):
            if sequence is not None:
                tables[row, :len(sequence.blocks)] = sequence.blocks
        return tables

    def _grow(self, sequence: LiveSequence, positions: int) -> None:
        """Give `sequence` blocks for its first `positions` positions."""
        missing = blocks_for(positions, self.block_size) - len(sequence.blocks)
        if missing > 0:
            sequence.blocks += self.allocators[sequence.shard].allocate(missing)

    def _shareable(self, prompt: Sequence[int]) -> int:
        """How many of a prompt's leading blocks its samples and later prompts may share: its full blocks, short
        of the one holding its last token (a prefill must run at least that token to sample after it)."""
        return (len(prompt) - 1) // self.block_size

    def _cached_blocks(self, shard: int, prompt: Sequence[int]) -> list[int]:
        """The blocks of shard `shard` that hold the longest run of `prompt`'s leading shareable blocks."""
        blocks = []
        for k in range(1, self._shareable(prompt) + 1):
            block = self._prompt_blocks.get((shard, tuple(prompt[:k * self.block_size])))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _remember_blocks(self, shard: int, prompt: Sequence[int], blocks: Sequence[int]) -> None:
        """Record that `blocks` (of shard `shard`) hold `prompt`'s leading full blocks."""
        for k, block in enumerate(blocks, 1):
            key = (shard, tuple(prompt[:k * self.block_size]))
            if key not in self._prompt_blocks:
                self._prompt_blocks[key] = block
                self._prompt_of_block[shard, block] = key

    @staticmethod
    def _streams(requests: Sequence[Request | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's request id and draw origin (what its random stream is keyed by; 0 for an empty row)."""
        return (np.array([0 if r is None else r.id for r in requests], np.int32),
                np.array([0 if r is None else r.draw_origin for r in requests], np.int32))

    @staticmethod
    def _sampling_choice(requests: Sequence[Request | None]) -> tuple[tuple[SamplingParams, ...], np.ndarray]:
        samplings = tuple(dict.fromkeys(r.sampling for r in requests if r is not None)) or (SamplingParams(greedy=True),)
        choice = np.array([0 if r is None else samplings.index(r.sampling) for r in requests], np.int32)
        return samplings, choice

    # -- the session API -------------------------------------------------------------------------

    def can_admit(self, request: Request) -> bool:
        """Whether a slot and the blocks `request` may need are free now."""
        return self._place([request], [token_list(request.prompt)]) is not None

    def prefill(self, requests: Sequence[Request]) -> list[int]:
        """Admit `requests` into free slots now and sample each one's first token; returns their ids.

        Requests with the same prompt share its full blocks and one prefill (on one row shard while it has
        room). Raises (before touching the cache) if a request is malformed, or the free slots or blocks do not
        hold them all.
        """
        requests = list(requests)
        prompts, free, shards = self._admission(requests)
        if not requests:
            return []
        # One prefill row per distinct (shard, prompt), the rows of shard d at [d * per_shard, (d + 1) * per_shard);
        # its requests (in order) draw from its logits.
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for i, (shard, prompt) in enumerate(zip(shards, prompts)):
            groups.setdefault((shard, tuple(prompt)), []).append(i)
        per_shard = bucket_length(max(collections.Counter(shard for shard, _ in groups).values()), 1)
        # The prompt's leading full blocks that live sequences hold already are shared, not run again.
        hits = {group: self._cached_blocks(*group) for group in groups}
        rows: list[LiveSequence | None] = [None] * (self.num_shards * per_shard)
        row_of = {}
        for shard, prompt in groups:
            row = row_of[shard, prompt] = shard * per_shard + sum(1 for d, _ in row_of if d == shard)
            first = requests[groups[shard, prompt][0]]
            blocks = self.allocators[shard].share(hits[shard, prompt])
            blocks += self.allocators[shard].allocate(blocks_for(len(prompt), self.block_size) - len(blocks))
            rows[row] = LiveSequence(first, -1, blocks, 0, -1, first.max_new_tokens, shard)
        cached = np.zeros(len(rows), np.int32)  # positions each row finds in the cache
        tails = {group: group[1][len(hits[group]) * self.block_size:] for group in groups}
        tokens = np.zeros((len(rows), bucket_length(max(map(len, tails.values())))), np.int32)
        counts = np.zeros(len(rows), np.int32)
        for group, row in row_of.items():
            cached[row] = len(hits[group]) * self.block_size
            tokens[row, :len(tails[group])] = tails[group]
            counts[row] = len(tails[group])
        draws = bucket_length(len(requests), 1)
        sample_rows = np.zeros(draws, np.int32)
        owner: list[Request | None] = [None] * draws
        for group, members in groups.items():
            for i in members:
                sample_rows[i], owner[i] = row_of[group], requests[i]
        samplings, choice = self._sampling_choice(owner)
        self.cache, new_tokens, logprobs, policy_logprobs = forward_program(
            self._graphdef, self._state, self.cache, self._tables(rows), cached, tokens, counts, sample_rows,
            self.key, *self._streams(owner), choice, width=bucket_length(cached.max()) if cached.any() else 0,
            samplings=samplings, mesh=self.mesh)
        new_tokens, logprobs, policy_logprobs = jax.device_get((new_tokens, logprobs, policy_logprobs))

        # Hand the prefilled blocks to the requests: the full ones shared, the partial last one copied.
        copies: list[list[tuple[int, int]]] = [[] for _ in range(self.num_shards)]
        for (shard, prompt), members in groups.items():
            prefilled = rows[row_of[shard, prompt]]
            full = len(prompt) // self.block_size
            self._remember_blocks(shard, prompt, prefilled.blocks[:full])
            self._groups += 1  # its members hold the same keys for the whole prompt (the partial block copied)
            for n, i in enumerate(members):
                blocks = prefilled.blocks if n == 0 else self.allocators[shard].share(prefilled.blocks[:full])
                if n > 0 and full < len(prefilled.blocks):
                    (copy,) = self.allocators[shard].allocate(1)
                    copies[shard].append((prefilled.blocks[full], copy))
                    blocks = blocks + [copy]
                slot = free[shard].pop(0)
                sequence = LiveSequence(requests[i], slot, list(blocks), len(prompt), -1, requests[i].max_new_tokens, shard,
                                        shared=len(prompt), group=self._groups)
                sequence.record(new_tokens[i], logprobs[i], policy_logprobs[i], self.version,
                                set(requests[i].stop_tokens))
                self._slots[slot] = sequence
                self._sequences[requests[i].id] = sequence
        if any(copies):
            self._copy_blocks(copies)
        return [r.id for r in requests]

    def _admission(self, requests: list[Request]):
        """(each request's prompt, each shard's free slots, the shard each request goes to), or a one-line error
        (a malformed request, a repeated id, too few free slots or blocks) before the cache is touched."""
        prompts = [self._check_request(r) for r in requests]
        if len({r.id for r in requests}) != len(requests):
            raise ValueError("request ids must be unique among the requests in flight; two requests share an id")
        free = {d: self._free_slots(d) for d in range(self.num_shards)}
        if len(requests) > sum(map(len, free.values())):
            raise ValueError(f"{len(requests)} requests but {sum(map(len, free.values()))} free slots; release "
                             f"sequences or wait")
        shards = self._place(requests, prompts)
        if shards is None:
            unclaimed = sum(self._unclaimed_blocks(d) for d in range(self.num_shards))
            raise ValueError(f"{len(requests)} requests may need {self._blocks_needed(requests)} blocks but {unclaimed} "
                             f"are free{' over the row shards' if self.num_shards > 1 else ''}; release sequences "
                             f"or wait")
        return prompts, free, shards

    def _copy_blocks(self, copies: list[list[tuple[int, int]]]) -> None:
        """Copies blocks within each shard's part of the cache: `copies[shard]` its (source, destination) pairs (a
        prompt's partial last block, copied for each request after the first: copy-on-write)."""
        # Each shard's copies in its part of two id arrays, at least 16 (one compiled copy for every few groups);
        # padding copies the null block onto itself.
        size = bucket_length(max(map(len, copies)))
        sources, destinations = np.zeros((2, self.num_shards, size), np.int32)
        for shard, pairs in enumerate(copies):
            if pairs:
                sources[shard, :len(pairs)], destinations[shard, :len(pairs)] = zip(*pairs)
        self.cache = copy_program(self.cache, sources.reshape(-1), destinations.reshape(-1), mesh=self.mesh)

    def decode(self, max_steps: int | None = None) -> dict[int, Completion]:
        """Run decode steps until every live sequence has stopped (or `max_steps` steps); returns them by id.

        Stopped sequences keep their slot and cache until `release` (or `extend`)."""
        steps = 0
        while self.num_running and (max_steps is None or steps < max_steps):
            steps += self._decode_chunk(exit_after=self.num_slots + 1,
                                        steps=self.decode_chunk if max_steps is None else min(self.decode_chunk, max_steps - steps))
        return {i: s.completion() for i, s in self._sequences.items()}

    def extend(self, sequence_id: int, tokens: Sequence[int], max_new_tokens: int,
               sampling: SamplingParams | None = None) -> None:
        """Append `tokens` (not sampled by the policy: a tool's output, a user turn) to a stopped sequence, run
        them through the model after its cache and sample the next token; it then runs again for up to
        `max_new_tokens` more tokens (with `sampling`, or its request's). The same tokens and log-probs as a
        prefill of the whole history."""
        sequence = self._sequences.get(sequence_id)
        if sequence is None:
            raise KeyError(f"no live sequence with id {sequence_id}; extend a sequence that prefill admitted and "
                           f"release has not returned")
        if sequence.running:
            raise ValueError(f"sequence {sequence_id} is still running; decode until it stops, then extend it")
        tokens = token_list(tokens)
        if tokens and (min(tokens) < 0 or max(tokens) >= self.config.vocab_size):
            raise ValueError(f"extend({sequence_id}): token ids outside [0, {self.config.vocab_size})")
        if not is_int_in(max_new_tokens, 1):
            raise ValueError(f"extend({sequence_id}): max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        new = [sequence.pending] + tokens  # the stopping token enters the cache with them
        end = sequence.length + len(new) + max_new_tokens
        if end > self.max_context:
            raise ConfigError(f"extend({sequence_id}): {sequence.length + len(new)} positions + max_new_tokens="
                              f"{max_new_tokens} exceed the engine's context of {self.max_context}")
        need = self._worst_case_blocks(sequence.length, len(new) + max_new_tokens) - len(sequence.blocks)
        if need > self._unclaimed_blocks(sequence.shard):
            raise ValueError(f"extend({sequence_id}) may need {need} blocks but {self._unclaimed_blocks(sequence.shard)}"
                             f" are free{' on its row shard' if self.num_shards > 1 else ''}; release sequences first")
        request = sequence.request if sampling is None else dataclasses.replace(sequence.request, sampling=sampling)
        self._grow(sequence, sequence.length + len(new))
        width = bucket_length(sequence.length)
        samplings, choice = self._sampling_choice([request])
        # One row per row shard, the sequence's on its shard and the others empty.
        rows = [sequence if d == sequence.shard else None for d in range(self.num_shards)]
        padded = np.zeros((self.num_shards, bucket_length(len(new))), np.int32)
        padded[sequence.shard, :len(new)] = new
        lengths, counts = np.zeros((2, self.num_shards), np.int32)
        lengths[sequence.shard], counts[sequence.shard] = sequence.length, len(new)
        self.cache, token, logprob, policy_logprob = forward_program(
            self._graphdef, self._state, self.cache, self._tables(rows), lengths, padded, counts,
            np.array([sequence.shard], np.int32), self.key, *self._streams([request]), choice, width=width,
            samplings=samplings, mesh=self.mesh)
        for t in tokens:
            sequence.tokens.append(t)
            sequence.sampled.append(False)
            sequence.logprobs.append(0.0)
            sequence.policy_logprobs.append(0.0)
            sequence.versions.append(-1)
        sequence.request = request
        sequence.length += len(new)
        sequence.remaining, sequence.finish_reason = int(max_new_tokens), None
        sequence.record(int(token[0]), float(logprob[0]), float(policy_logprob[0]), self.version,
                        set(request.stop_tokens))

    def release(self, sequence_id: int) -> Completion:
        """Free a sequence's slot and blocks; returns what it generated."""
        sequence = self._sequences.pop(sequence_id, None)
        if sequence is None:
            raise KeyError(f"no live sequence with id {sequence_id}")
        allocator = self.allocators[sequence.shard]
        allocator.release(sequence.blocks)
        for block in sequence.blocks:  # a freed block may be handed out again: its prompt tokens are gone
            if not allocator.references(block):
                self._prompt_blocks.pop(self._prompt_of_block.pop((sequence.shard, block), None), None)
        self._slots[sequence.slot] = None
        return sequence.completion()

    # -- continuous batching -----------------------------------------------------------------------

    def _chunk_rows(self, running: list[LiveSequence | None]) -> tuple[list[LiveSequence | None], SharedPrefixes | None, int]:
        """The decode chunk's rows, its shared prefixes and their width (`engine_decode`'s `prefixes`, `prefix_width`).

        Where the samples of a prompt still run together, the rows are reordered (within each row shard) so
        that they sit in consecutive groups of `share` rows reading the prompt once (`plan_prefix_rows`);
        otherwise (or when the model slides a window, whose distances need all of a row's positions in one
        view) the rows stay in slot order with no prefixes."""
        groups = collections.Counter(prefix_key(s) for s in running if s is not None)
        largest = max((n for key, n in groups.items() if key is not None), default=1)
        if largest < 2 or self.config.sliding_window:
            return running, None, 0
        # Groups of `share` rows, a power of two dividing the shard's slots: the largest that fits the largest
        # group, and never smaller than an earlier chunk's (one compiled decode per share, not one per chunk).
        share = 1 << (largest.bit_length() - 1)
        while self.slots_per_shard % share:
            share //= 2
        self._share = share = max(self._share, share)
        order, prefix_rows = [], []
        for shard in range(self.num_shards):
            rows = running[shard * self.slots_per_shard:(shard + 1) * self.slots_per_shard]
            for members, shared in plan_prefix_rows(rows, share):
                order += members + [None] * (share - len(members))
                prefix_rows.append(members[0] if shared else None)
        lengths = np.array([0 if s is None else s.shared for s in prefix_rows], np.int32)
        if not lengths.any():  # no prompt's samples fit a group of their own
            return running, None, 0
        prefixes = SharedPrefixes(self._tables(prefix_rows), lengths, np.repeat(lengths, share))
        return order, prefixes, bucket_length(lengths.max())

    def _decode_chunk(self, exit_after: int, steps: int) -> int:
        """One compiled chunk of decode steps over all slots; returns how many steps ran."""
        running = [s if s is not None and s.running else None for s in self._slots]
        for s in running:
            if s is not None:  # blocks for the positions this chunk may write
                self._grow(s, s.length + min(steps, s.remaining))
        running, prefixes, prefix_width = self._chunk_rows(running)
        starts = np.zeros(len(running), np.int32) if prefixes is None else prefixes.starts
        # Columns for the positions each row holds past its shared prefix: none in the chunk after a prompt's
        # samples were prefilled together (their prefix holds the whole prompt).
        own = max(s.length - start for s, start in zip(running, starts) if s is not None)
        width = bucket_length(own) if own else 0
        if self.reads_pages_in_place:  # no dense view: one program whatever the lengths
            width = prefix_width = 0
        rows = self.num_slots
        lengths, pending, remaining = (np.zeros(rows, np.int32) for _ in range(3))
        stop = np.full((rows, STOP_SLOTS), -1, np.int32)
        for row, s in enumerate(running):
            if s is not None:
                lengths[row], pending[row], remaining[row] = s.length, s.pending, s.remaining
                stops = sorted(set(s.request.stop_tokens))
                stop[row, :len(stops)] = stops
        samplings, choice = self._sampling_choice([None if s is None else s.request for s in running])
        self.cache, final = decode_program(
            self._graphdef, self._state, self.cache, self._tables(running), lengths, pending,
            np.array([s is not None for s in running]), remaining, stop, self.key,
            *self._streams([None if s is None else s.request for s in running]), choice, np.int32(exit_after), prefixes,
            width=width, steps=steps, samplings=samplings, mesh=self.mesh, prefix_width=prefix_width,
            in_place=self.reads_pages_in_place)
        ran, new_lengths, tokens, logprobs, policy_logprobs = jax.device_get(
            (final.step, final.lengths, final.tokens, final.logprobs, final.policy_logprobs))
        for row, s in enumerate(running):
            if s is None:
                continue
            stops = set(s.request.stop_tokens)
            for k in range(int(new_lengths[row]) - s.length):
                s.record(tokens[row, k], logprobs[row, k], policy_logprobs[row, k], self.version, stops)
            s.length = int(new_lengths[row])
        return int(ran)

    def reseed(self, key: jax.Array) -> None:
        """Draw with `key` from now on, as if the engine were created with it (no sequence may be live)."""
        if self._sequences:
            raise ValueError("a new key changes every draw: release the live sequences first")
        self.key, self._keyed = key, True

    def generate(self, requests: Sequence[Request], *, key: jax.Array | None = None) -> list[Completion]:
        """Every request's completion, in the order given, through the slots with continuous batching.

        `key`: the PRNG key of these requests' draws from now on (as if the engine were created with it)."""
        requests = list(requests)
        if key is not None:
            self.reseed(key)
        prompts = {r.id: self._check_request(r) for r in requests}  # each prompt's tokens, read once
        if len(prompts) != len(requests):
            raise ValueError("request ids must be unique; two requests share an id")
        queue = collections.deque(requests)
        wanted = {r.id for r in requests}
        done: dict[int, Completion] = {}
        while queue or self.num_running:
            head = [queue[i] for i in range(min(len(queue), self._slots.count(None)))]
            admitted = [queue.popleft() for _ in range(self._head_that_fits(head, prompts))]
            if queue and not admitted and not self._sequences:
                raise RuntimeError(f"request {queue[0].id} cannot be admitted into an idle engine; raise num_blocks")
            if admitted:
                self.prefill(admitted)
            if self.num_running:
                self._decode_chunk(exit_after=self.refill if queue else self.num_slots + 1, steps=self.decode_chunk)
            for sequence_id in [i for i, s in self._sequences.items() if not s.running and i in wanted]:
                done[sequence_id] = self.release(sequence_id)
        return [done[r.id] for r in requests]

    def _blocks_needed(self, requests: Iterable[Request]) -> int:
        """Blocks `requests` may claim over their lives (prompt and whole budget; prefix sharing not counted)."""
        return sum(self._worst_case_blocks(len(token_list(r.prompt)), r.max_new_tokens) for r in requests)

    def _head_that_fits(self, requests: Sequence[Request], prompts: dict[int, list[int]]) -> int:
        """The most leading `requests` that free slots and unclaimed blocks hold now (`prompts`: their tokens by id).

        A head fits whenever a longer one does (`_place` places them in order), so this bisects: a few
        placements, not one per request."""
        fits = lambda n: self._place(requests[:n], [prompts[r.id] for r in requests[:n]]) is not None  # noqa: E731
        low, high = 0, len(requests)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        return low
