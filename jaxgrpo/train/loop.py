"""The GRPO loop: sample -> reward -> advantage -> loss -> update, step after step.

One training step:

1. sample `group_size` completions for each of `prompts_per_step` prompts with the current policy
   and score them with the task's reward functions, resampling groups without signal under DAPO
   dynamic sampling (`rollout.collect`);
2. compute advantages with the registered estimator (`cfg.advantage`), or GAE with a value head
   (`batch.train_batch`);
3. for `num_epochs` x `num_minibatches`, call the jitted update (`step.make_update_fn`). With
   `cfg.packing` (the default on a CPU or TPU) each micro-batch is scored as packed prompt groups
   (`jaxgrpo.models.packing`): a prompt once, its completions without padding, rows that do not
   train left out; the log-probs are the same.

Multi-host (one process per host, `jax.distributed.initialize()` called first, as `jaxgrpo.tools.cli`
does): the mesh spans every host's devices and every process runs this same loop, on identically
built models laid out on the global mesh.

* Every host reads only its own share of the step's prompts: process p of P takes the contiguous
  block p of the `prompts_per_step` positions of the deterministic `PromptStream`
  (`distributed.process_block`; prompts_per_step must divide by P, so groups never straddle hosts),
  and all advance the stream to the same position.
* Sampling is one global SPMD program; each host's rows of the result are on its own devices and
  it copies back only those (`distributed.local_rows`). Each host decodes and scores its own rows;
  the small per-row numbers (`RowStats`) are gathered, so every host computes the same advantages
  and metrics from the whole batch and keeps its rows' advantages.
* The update's inputs are global arrays built from each host's rows; the minibatches are gathered
  from them on device, so a shuffle moves rows between hosts exactly as a single process would.
* Dynamic sampling: a round's width is the largest number of groups any host still needs (a
  cross-process max), so all hosts run the same rounds and programs.
* Checkpoints are written and restored by every process (orbax writes each host's shards);
  metrics, plots and progress bars come from process 0 only, and so do the run directory's lock
  and checks (`jaxgrpo.run.rundir`), whose verdict every process gets.

The result equals a single-process run on the same number of devices (`tests/train/test_multihost.py`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo import profiling, rng, sampler
from jaxgrpo.config import Config, resolve_packing
from jaxgrpo.distributed import BATCH_AXES, across_processes, batch_shards, round_up, gather_rows, global_batch, local_rows, on_mesh
from jaxgrpo.errors import ConfigError
from jaxgrpo.models import packing, partitioning
from jaxgrpo.models.attention import target_platform as attention_platform
from jaxgrpo.models.partitioning import shard_model
from jaxgrpo.train import batch as batch_lib
from jaxgrpo.train import driver, guidance, preflight, trackers
from jaxgrpo.train import partial as partial_lib, rollout as rollout_lib, state as state_lib, step as step_lib
from jaxgrpo.train import device_memory
from jaxgrpo.train.rollout import PromptStream, RowStats, Trajectories, row_stats
from jaxgrpo.train.state import LoopState, Policy
from jaxgrpo.train.step import TrainBatch

Array = jax.Array
logger = logging.getLogger(__name__)


class Trainer:
    """Runs a `Config`: builds the policy, task, rewards, mesh and jitted update, then loops.

    Everything can also be passed in (a model and tokenizer, a task, reward functions) so tests and
    notebooks run without downloads. The trainer holds what does not change during a run (the config, the
    data, the model's graph and read-only parts, the compiled programs); what changes is a `LoopState`
    (the train state the update donates, the reference, the data position, the key and the step: what a
    checkpoint holds), threaded through small parts, each a function of it:

        rollout(state) -> (rollout, state, timings)     sample and score the step's groups (data position moves)
        advantages(state, rollout) -> batch               the host stages: rewards to per-token advantages
        learn(state, batch, rollout) -> (state, metrics)  the updates (and stateful kernels' state)
        step(state) -> (state, metrics)                   the three, one GRPO step

    `run` is the driver: resume or start, warm up, step, evaluate, checkpoint. `loop_state` is the state it
    holds (the initial one before a run), which `generate` and evaluation sample from.
    With `cfg.lora` the model is adapted (`state.adapt`): the train state's params are the adapters,
    `self.rest` the read-only base, and the KL reference the base with the adapters off (no copy kept).
    """

    def __init__(self, cfg: Config, *, model=None, tokenizer=None, task=None, reward_fns=None, mesh=None):
        cfg, task, reward_fns, train_examples, eval_examples = preflight.check_trainer(cfg, model, task, reward_fns, mesh)
        self._cfg = cfg
        split = cfg.mesh.rollout_devices
        learner_devices, sampler_devices = state_lib.split_devices(split) if split else (None, None)
        self.mesh = mesh or state_lib.make_mesh(cfg, learner_devices)
        self._local_sampler = preflight.samples_locally()
        if self._local_sampler and not split:  # the engine on this process's devices, time-shared with the learner
            sampler_devices = jax.local_devices()
        #: The sampler's own devices (`mesh.rollout_devices`, the last ones; in a multi-process run this process's
        #: own share, where it samples its own prompts, the weights split over them), or None: it shares `mesh`.
        self.rollout_mesh = None if not sampler_devices else (
            state_lib.process_sampler_mesh(sampler_devices) if self._local_sampler
            else state_lib.rollout_mesh(sampler_devices))
        if model is None:
            model, tokenizer = state_lib.build_model(cfg)
            preflight.check_budget(cfg, model.config)  # a model built in code: its window is known now
        if tokenizer is None:
            raise ConfigError(f"model {cfg.model!r} has no tokenizer; the trainer needs one to render prompts: give "
                              "a model directory with its tokenizer files")
        self.tokenizer = tokenizer
        # An environment's turns in token space (`run_episodes`): the template renders its messages, checked here.
        self.chat_turns = None if cfg.environment is None else preflight.environment_turns(cfg, tokenizer, train_examples)
        self.task = task
        self.reward_fns = reward_fns
        self.stop_tokens = tuple(sampler.default_stop_tokens(tokenizer))
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

        self.attention_scale = packing.attention_scale(model.config)  # for packed row layouts
        shard_model(model, self.mesh)  # FSDP / tensor-parallel layout from the model's logical axes
        model = state_lib.adapt(model, cfg, self.mesh)  # LoRA: adapters on the projections, the base read-only
        # `params` train (every parameter, or LoRA's adapters); `rest` is read-only, an argument of every program.
        self.graphdef, params, self.rest = nnx.split(Policy(model, value_head=cfg.value_head),
                                                     state_lib.trainable(cfg), ...)
        # The read-only rest as the sampler's devices hold it (with `rollout_mesh`).
        self._sampler_rest = None if self.rollout_mesh is None else self._placed_on_sampler(self.rest)
        self._placed = None  # (the learner's params, their copy on the sampler's devices) for evaluation
        self.optimizer = state_lib.make_optimizer(cfg.optimizer)
        train = state_lib.init_state(params, self.optimizer, self.mesh)
        reference = state_lib.reference_params(cfg, params)
        self._updates: dict = {}  # packed shape -> jitted update (compiled on first use)
        self._forward = step_lib.make_forward_fn(cfg, self.graphdef, self.rest)
        self._take_rows = jax.jit(lambda batch, rows: jax.tree.map(lambda x: x[rows], batch),
                                  out_shardings=NamedSharding(self.mesh, P(None, BATCH_AXES)))

        self.train_examples = train_examples
        if cfg.value_tracker:  # a state per prompt of the training split, kept in the train state
            self.train_examples = trackers.indexed(self.train_examples)
            kernel_state = trackers.init_state(cfg, len(self.train_examples))
            train = train._replace(kernel_state=on_mesh(kernel_state, self.mesh))
        self.state_sharding = jax.tree.map(lambda x: x.sharding, train)
        root = rng.run_key(cfg.seed)
        # The training prompts' order, read at a `LoopState.data_position`.
        self.prompts = PromptStream(self.train_examples, rng.seed_of(rng.stream(root, "prompts")))
        self.eval_examples = eval_examples
        self._prompt_cache: dict[str, list[int]] = {}
        self._engine, self._engine_params = None, None  # the rollout engine (`engine`)
        # One-step-off: the behaviour policy's own copy of the parameters (the update donates the learner's).
        self._view = None  # multi-process: (the behaviour parameters, their copy on this process's sampler)
        behaviour = self.behaviour_copy(train.params) if cfg.max_staleness else None
        #: The state the driver holds: the initial one (step 0, the seed's key), then each step's (`run`).
        #: Generation and evaluation sample the policy it holds; `step` and its parts take and return state.
        self.loop_state = LoopState(train, reference, 0, root, behaviour=behaviour)
        self._pending = None  # one-step-off: (behaviour params, the next step's rollout sampled meanwhile)
        self._sampler_thread = None
        self._clock = time.perf_counter()  # the origin of the metrics' time_at_* (seconds)

    @property
    def cfg(self) -> Config:
        """The config this trainer runs, `packing` settled for its mesh's platform."""
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        self._cfg = resolve_packing(cfg, attention_platform(self.mesh))

    @property
    def state(self) -> state_lib.TrainState:
        """The train state of `loop_state` (read-only: a part returns a new `LoopState`)."""
        return self.loop_state.train

    @property
    def policy(self) -> Policy:
        """The policy of `loop_state`."""
        return self.policy_of(self.loop_state.train.params)

    def policy_of(self, params) -> Policy:
        """The policy with trainable parameters `params` (a train state's, or a copy on the sampler's devices) and
        this trainer's read-only rest on the same devices."""
        return nnx.merge(self.graphdef, params, self.rest if self._on_learner(params) else self._sampler_rest)

    def _on_learner(self, params) -> bool:
        if self.rollout_mesh is None:
            return True
        return not set(jax.tree.leaves(params)[0].devices()) <= set(self.rollout_mesh.devices.flat)

    def to_sampler(self, params):
        """A copy of `params` where the sampler samples: moved to the sampler's devices (`rollout_mesh`, device to
        device, laid out by the parameters' logical axes), or a copy beside them when sampler and learner share."""
        if self.rollout_mesh is None:
            return jax.tree.map(jnp.copy, params)
        return self._placed_on_sampler(params)

    def _placed_on_sampler(self, tree):
        """`tree` (on the learner's mesh) laid out on `rollout_mesh`. In a multi-process run the learner's mesh
        spans the processes and each process's sampler is its own: one collective of the learner's mesh gives each
        process a copy split over its learner devices (`state.process_copy`), which it moves to its sampler's
        devices (where they are the same devices, as they are)."""
        if self._local_sampler:
            tree = state_lib.process_copy(tree, self.mesh)
        return partitioning.place_state(tree, self.rollout_mesh)

    def behaviour_copy(self, params):
        """What `LoopState.behaviour` holds for the policy of `params` (one-step-off): its copy on the sampler's
        devices (`to_sampler`); in a multi-process run a copy on the learner's mesh instead, which a checkpoint
        saves as the learner's params, each process's sampler sampling from its own copy of it
        (`sampler_params`)."""
        return jax.tree.map(jnp.copy, params) if self._local_sampler else self.to_sampler(params)

    def sampler_params(self, params):
        """The parameters the sampler samples the policy of `params` (a state's, or its `behaviour`) with: `params`,
        or where each process samples on its own devices (`preflight.samples_locally`) their copy there (made once per
        policy, by a collective of the learner's mesh: on the main thread)."""
        if not self._local_sampler or not self._on_learner(params):
            return params
        if self._view is None or self._view[0] is not params:
            self._view = (params, self.to_sampler(params))
        return self._view[1]

    def _sampling_mesh(self, params):
        """The mesh the policy of `params` samples on: the learner's, or the sampler's own (`rollout_mesh`)."""
        return self.mesh if self._on_learner(params) else self.rollout_mesh

    def _samples_on_own_devices(self, params) -> bool:
        """Whether the policy of `params` samples on this process's own devices in a multi-process run (each
        process's sampler, one-step-off), so that nothing is exchanged between processes while it samples."""
        return self._local_sampler and not self._on_learner(params)

    def _sampling_params(self):
        """What `generate` and evaluation sample with by default: `loop_state`'s policy, on the sampler's devices
        when it has its own (moved once per update)."""
        params = self.loop_state.train.params
        if self.rollout_mesh is None:
            return params
        if self._placed is None or self._placed[0] is not params:
            self._placed = (params, self.to_sampler(params))
        return self._placed[1]

    def reference(self, state: LoopState):
        """The parameters the KL reference of `state` is scored with (`state.reference_of`)."""
        return state_lib.reference_of(self.cfg, state.train.params, state.reference)

    def prompt_ids(self, example: dict) -> list[int]:
        """The token ids of an example's rendered prompt (cached by text)."""
        from jaxgrpo.data import render_prompt

        text = render_prompt(self.tokenizer, self.task.messages(example))
        if text not in self._prompt_cache:
            self._prompt_cache[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self._prompt_cache[text]

    def generate(self, examples: list[dict], num_samples: int, key: Array, *, greedy: bool = False,
                 prompt_ids: np.ndarray | None = None, params=None):
        """`num_samples` completions of each example's prompt through the rollout engine (`generate_tokens`)."""
        return self.generate_tokens([self.prompt_ids(e) for e in examples], num_samples, key, greedy=greedy,
                                    prompt_ids=prompt_ids, params=params)

    def generate_tokens(self, prompts: list[list[int]], num_samples: int, key: Array, *, greedy: bool = False,
                        prompt_ids: np.ndarray | None = None, params=None, max_new_tokens: int | None = None):
        """`num_samples` completions of each token prompt (e.g. a prompt and a completion so far, continued: partial
        rollouts) by the policy of `params` (default: `loop_state`'s), at most `max_new_tokens` new tokens each
        (default `sampling.max_new_tokens`), through the rollout engine (`engine`), as a `sampler.Generation` on a
        device of the sampler's. In a multi-process run `prompts` are this process's own; `prompt_ids` (default
        0..B-1) key their draws."""
        from jaxgrpo import engine as engine_lib

        params = self._sampling_params() if params is None else params
        budget = self.cfg.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
        engine = self.engine(params)
        with device_memory.reported(self.cfg, "sampler", self.mesh):
            out = engine_lib.generate_groups(
                engine, prompts, num_samples=num_samples, key=key, max_new_tokens=budget,
                sampling=self._sampling(greedy), stop_tokens=self.stop_tokens, prompt_ids=prompt_ids,
                pad_id=self.pad_id)
        # On a device of the sampler's (the learner's, or its own devices), where the rest of the step reads it.
        devices = self._sampling_mesh(params).devices.flat
        return jax.device_put(out, next(d for d in devices if d.process_index == jax.process_index()))

    def engine(self, params=None):
        """The rollout engine the trainer samples through (single turns and `environment` episodes), made on
        first use with one slot per sample of a step, holding the policy of `params` (default: `loop_state`'s):
        its weights swapped in place (no copy; a new policy version) whenever they changed."""
        from jaxgrpo import engine as engine_lib

        params = self._sampling_params() if params is None else params
        s, e, decoder = self.cfg.sampling, self.cfg.environment, self.policy_of(params).decoder
        if self._engine is None:
            # An episode's positions, or the sampler's prompt bucket and the completion budget.
            # Partial rollouts continue a row from its prompt and tokens so far: room for a whole completion more.
            context = e.max_context if e is not None else (
                sampler.bucket_length(s.max_prompt_len) + s.max_new_tokens * (2 if self.cfg.partial_rollout_tokens else 1))
            window = sampler.model_context_window(decoder)
            mesh = _mesh_above_one(self._sampling_mesh(params))
            shards = batch_shards(mesh)  # the slots split over the mesh's data and fsdp axes
            rows = self.cfg.prompts_per_step * self.cfg.group_size // jax.process_count()
            self._engine = engine_lib.Engine(  # a slot per sample of this process's share of the step
                decoder, num_slots=round_up(rows, shards),
                max_context=context if window is None else min(context, window), decode_chunk=s.max_new_tokens,
                mesh=mesh)
        elif self._engine_params is not params:
            self._engine.update_weights(decoder)
        self._engine_params = params
        return self._engine

    def _sampling(self, greedy: bool):
        s = self.cfg.sampling
        return sampler.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                                      greedy=greedy)

    def run_episodes(self, examples: list[dict], num_samples: int, key: Array, *, greedy: bool = False,
                     params=None, first_id: int = 0):
        """`num_samples` episodes of `cfg.environment` per example through the rollout engine (`engine`, the policy
        of `params`, default `loop_state`'s) in token space (`engine.multi_turn.rollout`): (trajectories
        example-major, stats)."""
        from jaxgrpo import envs
        from jaxgrpo.engine import multi_turn

        e = self.cfg.environment
        engine = self.engine(params)
        with device_memory.reported(self.cfg, "sampler", self.mesh):
            return multi_turn.rollout(engine, self.chat_turns, lambda: envs.make_environment(e.name, **e.kwargs), examples,
                                      group_size=num_samples, max_turns=e.max_turns,
                                      turn_tokens=self.cfg.sampling.max_new_tokens, sampling=self._sampling(greedy),
                                      key=key, step_timeout=e.step_timeout, first_id=first_id)

    def rollout(self, state: LoopState, key: Array | None = None) -> tuple[Trajectories, LoopState, dict]:
        """This host's share of the step's groups, sampled by the behaviour policy of `state` and scored
        (`rollout.collect`, or `rollout.collect_episodes` with an environment), `state` with the data position
        after them, and the step's timings. The behaviour policy is the learner's (`state.train`), or one-step-off
        `state.behaviour`, one update behind it. With partial rollouts (`cfg.partial_rollout_tokens`) the groups
        `state.partial` carries are continued first, and those still going are carried in the state returned.
        `key`: the step's (`rng.stream(state.key, "sample", state.step)`) unless given."""
        key = rng.stream(state.key, "sample", state.step) if key is None else key
        prompts = self.prompts.at(state.data_position)
        if state.behaviour is None:
            params, version = state.train.params, state.step
        else:
            params, version = state.behaviour, max(state.step - 1, 0)
        params = self.sampler_params(params)
        if self.cfg.partial_rollout_tokens:
            rollout, prompts, carried, versions, timings = partial_lib.collect(
                self.cfg, key, prompts, state.partial, version, functools.partial(self.generate_tokens, params=params),
                self.tokenizer, self.reward_fns, self.prompt_ids)
            oldest = np.where(versions >= 0, versions, version).min(-1).astype(np.int32)
            rollout = rollout._replace(policy_version=oldest, token_versions=versions)
            return rollout, state._replace(data_position=prompts.position, partial=carried), timings
        if self.cfg.environment is not None:
            rollout, timings = rollout_lib.collect_episodes(
                self.cfg, key, prompts, functools.partial(self.run_episodes, params=params), self.tokenizer,
                self.pad_id)
        else:
            rollout, timings = rollout_lib.collect(
                self.cfg, key, prompts, functools.partial(self.generate, params=params), self.tokenizer,
                self.reward_fns, self.mesh, self._guide(state, params),
                local=self._samples_on_own_devices(params),
                agree=not (self._local_sampler and self.cfg.max_staleness))  # one-step-off's thread: no collective
            timings = guidance.summarize(timings)
        rollout = rollout._replace(policy_version=np.full(len(rollout.rewards), version, np.int32))
        return rollout, state._replace(data_position=prompts.position), timings

    def _guide(self, state: LoopState, params):
        """`guidance.scaffold` on this trainer's sampler (the policy of `params`), rewards and task (None without
        guidance, or before `guidance.after_step`)."""
        g = self.cfg.guidance
        if g is None or state.step < g.after_step:
            return None
        return functools.partial(
            guidance.scaffold, self.cfg,
            generate=lambda examples, n, key, ids: self.generate(examples, n, key, prompt_ids=ids, params=params),
            score=lambda out, examples: rollout_lib.scored(self.cfg, out, examples, self.tokenizer, self.reward_fns,
                                                           np.zeros(len(examples), np.int32)),
            hints=guidance.task_hints(self.task), prompt_length=lambda example: len(self.prompt_ids(example)))

    def logprobs(self, params, tokens, attention, positions, completion_len: int) -> np.ndarray:
        """f32[n, C]: this host's rows' completion log-probs under the policy of `params` (a train state's, or
        `reference`'s)."""
        return self._scored(params, (tokens, attention, positions), completion_len, 0)

    def values(self, params, tokens, attention, positions, completion_len: int) -> np.ndarray:
        """f32[n, C]: the value head's values of this host's rows' completion tokens (`cfg.value_head`)."""
        return self._scored(params, (tokens, attention, positions), completion_len, 1)

    def _scored(self, params, rows, completion_len: int, output: int) -> np.ndarray:
        with profiling.phase("score"), device_memory.reported(self.cfg, "scoring forward", self.mesh):
            outputs = self._forward(params, *global_batch(rows, self.mesh), completion_len)
            return local_rows(outputs[output], self.mesh)

    def advantages(self, state: LoopState, rollout: Trajectories, stats: RowStats | None = None,
                   metrics: dict | None = None) -> TrainBatch:
        """The update's arrays for this host's rows (`batch.train_batch`): the host stages' per-token advantages,
        scored under `state`'s policy and reference where a stage or the KL term reads them. `stats`: the whole
        batch's `gather_rows(row_stats(rollout))`, if the caller has it; the stages' kernels' scalar metrics (an
        importance correction's weight statistics) go into `metrics` when given."""
        rows = {}
        if self.cfg.value_tracker:  # the tracked value of each row's prompt, from the steps before this one
            prompt_ids = trackers.prompt_ids(rollout.examples)
            rows["baseline"] = trackers.baseline(self.cfg, state.train.kernel_state, prompt_ids)
        weights = np.array([w for _, w in self.reward_fns], np.float32)
        params = state.train.params
        scorers = batch_lib.Scorers(
            policy=functools.partial(self.logprobs, params), values=functools.partial(self.values, params),
            reference=lambda *rows: self.logprobs(self.reference(state), *rows))
        return batch_lib.train_batch(self.cfg, rollout, weights, scorers, stats, rows, metrics)

    def learn(self, state: LoopState, batch: TrainBatch, rollout: Trajectories | None = None,
              stats: RowStats | None = None) -> tuple[LoopState, dict]:
        """The step's updates of `state` on `batch` (`update`), then a value tracker's state folded with the
        step's outcomes (`track`; `rollout` needed then). `state.train` is donated."""
        train, metrics = self.update(state.train, batch)
        if self.cfg.value_tracker:
            train = self.track(train, batch, rollout, stats)
        return state._replace(train=train), metrics

    def track(self, train: state_lib.TrainState, batch: TrainBatch, rollout: Trajectories,
              stats: RowStats | None = None) -> state_lib.TrainState:
        """`train` with the value tracker's state folded with the step's outcomes (`rollout`'s, its whole-batch
        `stats`) and each row's drift under the update that made `train`."""
        completion_len = batch.completion_mask.shape[-1]
        new_logp = self.logprobs(train.params, batch.tokens, batch.attention_mask, batch.positions, completion_len)
        kl = gather_rows(trackers.drift(batch.old_logp, new_logp, batch.completion_mask))
        stats = gather_rows(row_stats(rollout)) if stats is None else stats
        return train._replace(kernel_state=trackers.update(
            self.cfg, train.kernel_state, trackers.prompt_ids(rollout.examples), stats.correct, kl, stats.trains))

    def update(self, train: state_lib.TrainState, batch: TrainBatch) -> tuple[state_lib.TrainState, dict]:
        """num_epochs x num_minibatches jitted updates of `train` (donated) over the batch (this host's rows);
        returns the new train state and the mean metrics.

        Minibatches are shuffled over the whole batch by whole groups (packing scores a group at once):
        they are gathered on device from the global batch, so rows move between hosts as needed.
        """
        cfg = self.cfg
        whole = global_batch(batch, self.mesh)
        trees = batch_lib.packed_trees(cfg, batch)
        history = []
        # Compiling the update (its first call) or running it may not fit the device: one line naming what to
        # change. A failure while running surfaces when the metrics are read, inside this block too.
        with profiling.phase("update"), device_memory.reported(cfg, "update", self.mesh):
            for rows, packed_shape, layout in batch_lib.minibatches(cfg, whole.tokens.shape[0], int(train.step), trees,
                                                                    self.attention_scale):
                if packed_shape not in self._updates:
                    if packed_shape is not None:
                        logger.info("compiling the update for micro-batches of %d packed rows x %d slots (trees of %d "
                                    "rows)", *packed_shape)
                    self._updates[packed_shape] = step_lib.make_update_fn(
                        cfg, self.graphdef, self.rest, self.optimizer, self.mesh, self.state_sharding, packed_shape)
                with jax.set_mesh(self.mesh):
                    minibatch = self._take_rows(whole, rows)
                    train, metrics = self._updates[packed_shape](train, minibatch, *layout)
                history.append(metrics)
            metrics = {k: float(np.mean([float(h[k]) for h in history])) for k in history[0]}
        metrics["logp_gap"] = float(history[0]["logp_gap"])  # before any update: sampler vs trainer
        metrics["skipped_nonfinite"] = float(sum(float(h["skipped_nonfinite"]) for h in history))  # updates, not a mean
        return train, metrics

    def step(self, state: LoopState, *, last: bool = False) -> tuple[LoopState, dict]:
        """One GRPO step: rollout, advantages, learn. Returns the next state (`state.train` is donated) and the
        step's metrics.

        One-step-off (`cfg.max_staleness` >= 1): the step learns from the rollout `state.behaviour` sampled
        while the previous step learned (sampled now on a run's first step, or from a restored state: the same
        rollout, a function of the state), and meanwhile a thread samples the next step's by the policy before
        this update, whose parameters become the next state's `behaviour`. The step returns once both are done,
        so nothing is in flight between steps (evaluation and checkpoints see a quiet state). `last`: no step
        follows, so none is sampled (a run resumed from the state samples it then, the same)."""
        t_start = time.perf_counter()
        if not self.cfg.max_staleness:
            rollout, after, metrics = self._timed_rollout(state)
            learned, metrics = self._learn_rollout(state, rollout, metrics)
            behaviour = None
        else:
            rollout, after, metrics = self._pending_rollout(state)
            behaviour = self.behaviour_copy(state.train.params)  # its own copy: the update donates the learner's
            if not last:
                self.sampler_params(behaviour)  # moved to the sampler here, on the main thread (a collective)
            upcoming = after._replace(step=state.step + 1, behaviour=behaviour)
            if self._sampler_thread is None:
                self._sampler_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxgrpo-sampler")
            sampling = None if last else self._sampler_thread.submit(self._timed_rollout, upcoming)
            learned, metrics = self._learn_rollout(state, rollout, metrics)
            self._pending = None if last else (behaviour, sampling.result())
        metrics["time_step"] = time.perf_counter() - t_start
        return after._replace(train=learned.train, step=state.step + 1, behaviour=behaviour), metrics

    def _timed_rollout(self, state: LoopState) -> tuple[Trajectories, LoopState, dict]:
        """`rollout`, its start and end on the run's timeline (`time_at_sample_start`, `time_at_sample_end`)."""
        start = time.perf_counter() - self._clock
        rollout, after, timings = self.rollout(state)
        return rollout, after, {**timings, "time_at_sample_start": start,
                                "time_at_sample_end": time.perf_counter() - self._clock}

    def _pending_rollout(self, state: LoopState) -> tuple[Trajectories, LoopState, dict]:
        """One-step-off: the rollout of `state` the previous step sampled meanwhile, or sampled now (a run's first
        step, a restored state)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is state.behaviour:
            return pending[1]
        return self._timed_rollout(state)

    def _learn_rollout(self, state: LoopState, rollout: Trajectories, metrics: dict) -> tuple[LoopState, dict]:
        """Advantages and learning on `rollout` from `state`; the step's metrics added to `metrics` (the rollout's)."""
        if self._local_sampler:  # each process's sampler counted its own tokens and bucketed its own rows' widths
            metrics["sampled_tokens"] = int(across_processes(metrics["sampled_tokens"]).sum())
            widths = across_processes(np.array([rollout.prompt_tokens.shape[1], rollout.completion_tokens.shape[1]]))
            rollout = rollout_lib.padded(rollout, *np.asarray(widths).reshape(-1, 2).max(0).tolist())
        stats = gather_rows(row_stats(rollout))  # the whole batch's, on every host: gathered once per step
        start = time.perf_counter()
        batch = self.advantages(state, rollout, stats, metrics)
        signal = gather_rows(batch_lib.rows_with_signal(batch))  # the whole batch's, as `stats`
        t0 = time.perf_counter()
        state, learned = self.learn(state, batch, rollout, stats)
        metrics.update(learned)
        metrics["time_train"] = time.perf_counter() - t0
        metrics.update(rollout_lib.rollout_metrics(stats, metrics, self.cfg.num_epochs), frac_signal_rows=float(signal.mean()),
                       time_at_learn_start=start - self._clock, time_at_learn_end=time.perf_counter() - self._clock)
        if self.cfg.max_staleness:  # updates between the sampling policy and the learner, over the tokens that train
            versions = rollout.token_versions if rollout.token_versions is not None else np.broadcast_to(
                rollout.policy_version[:, None], rollout.completion_mask.shape)
            trained = (rollout.completion_mask > 0) & rollout.trains[:, None]
            lag = (state.step - versions)[trained] if trained.any() else np.zeros(1)
            metrics.update(staleness_max=float(lag.max()), staleness_mean=float(lag.mean()))
            # How far the behaviour policy's log-probs are from the learner's (the PPO ratio's anchor here).
            on = np.asarray(batch.completion_mask) > 0
            if rollout.sampler_logp is not None:
                gap = np.abs(np.asarray(batch.old_logp) - rollout.sampler_logp)[on]
                metrics["behaviour_logp_gap"] = float(gap.mean()) if gap.size else 0.0
        return state, metrics

    def run(self, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
            on_step: Callable[[int, dict], None] | None = None, profile: int = 0) -> list[dict]:
        """Trains for `cfg.steps` steps into `cfg.run_dir` (`driver.run`); returns the records of the steps it ran.

        A run directory that already holds a run is refused unless `resume` (continue from its newest
        checkpoint that restores, with a config that differs only in `rundir.RESUMABLE_KEYS`) or
        `overwrite` (delete its run files and start over; refused when it holds files no run wrote); a directory
        another run holds is refused (`jaxgrpo.run.rundir.RunDirectoryError`). The run stops with `NoLearningSignal`
        after `cfg.max_steps_without_signal` consecutive steps in which no row trains, with `NonFiniteUpdates`
        after `cfg.max_nonfinite_steps` consecutive steps with an update skipped as non-finite (each warned
        about; the state stays as before it), and warns once of each sign
        of collapse (`jaxgrpo.train.health`: entropy fallen while accuracy does not rise, every completion
        truncated).

        `on_step(step, record)` is called after each step's metrics, evaluation
        and checkpoint are written (e.g. for live plots in a notebook).

        `profile` N > 0 traces the N steps after the run's first (which compiles) with `jax.profiler` into
        RUN_DIR/profile/steps_<first>-<last>/, and writes there where they went (`profiling.StepTracer`:
        host phases, compiled programs, the model's parts); the path is logged.
        """
        return driver.run(self, resume=resume, overwrite=overwrite, progress=progress, on_step=on_step,
                          profile=profile)

def _mesh_above_one(mesh):
    """`mesh`, or None when it has one device (the engine then places nothing)."""
    return mesh if mesh.size > 1 else None
