"""Supervised warm-up before RL: the update's likelihood term on the task's reference answers, or on an
environment's demonstrated episodes (`Environment.demonstration`: e.g. a calculator call and the answer).

A tiny random model cannot sample a correct answer at all; a few teacher-forced steps give it the
partial competence that makes group-relative RL work. The warm-up runs the same jitted update as RL
(`step.make_update_fn`) with the likelihood objective (`step.likelihood_objective`) and its own Adam.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxgrpo import rng, sampler
from jaxgrpo.distributed import BATCH_AXES
from jaxgrpo.models.decoder import mask_positions
from jaxgrpo.train import device_memory, state as state_lib, step as step_lib
from jaxgrpo.train.rollout import PromptStream
from jaxgrpo.train.step import TrainBatch


def reference_completion(task, tokenizer, example: dict) -> list[int]:
    """Token ids of a correct completion: the task's own, else "The answer is N.", then EOS."""
    text = getattr(task, "reference_completion", None)
    text = text(example) if text else f"The answer is {example['answer']}."
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    eos = getattr(tokenizer, "eos_token_id", None)
    return ids + [eos] if eos is not None else ids


def episode_demonstration(trainer, example: dict) -> tuple[list[int], list[int], list[bool]]:
    """(prompt, tokens, loss mask) of the environment's demonstrated episode of `example`
    (`engine.multi_turn.demonstration`, with the trainer's chat turns)."""
    from jaxgrpo import envs
    from jaxgrpo.engine import multi_turn

    e = trainer.cfg.environment
    return multi_turn.demonstration(trainer.chat_turns, envs.make_environment(e.name, **e.kwargs), example)


def supervised_batch(prompts: list[list[int]], answers: list[list[int]], pad_id: int,
                     masks: list[list[bool]] | None = None, bucket: bool = False) -> TrainBatch:
    """One micro-batch [1, B, ...] of prompts (left padded) followed by their answers, the answers trained (only
    where `masks` says, when given: an episode's observations are attended to, not trained). `bucket`: widths
    rounded up to the sampler's buckets, so batches of varying lengths share a few compiled updates."""
    batch_size = len(prompts)
    width = max(map(len, prompts))
    cwidth = max(map(len, answers))
    if bucket:
        width, cwidth = sampler.bucket_length(width), sampler.bucket_length(cwidth)
    tokens = np.full((batch_size, width + cwidth), pad_id, np.int32)
    attention = np.zeros(tokens.shape, bool)
    mask = np.zeros((batch_size, cwidth), np.float32)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        tokens[i, width - len(p) : width] = p
        tokens[i, width : width + len(a)] = a
        attention[i, width - len(p) : width + len(a)] = True
        mask[i, : len(a)] = 1.0 if masks is None else masks[i]
    positions = mask_positions(attention)
    zeros = np.zeros_like(mask)
    return TrainBatch(*(x[None] for x in (tokens, attention, positions, mask, zeros, zeros, zeros, zeros, zeros)))


def supervised_warmup(trainer, loop_state, steps: int, *, lr: float | None = None,
                      batch_size: int | None = None) -> tuple:
    """`steps` teacher-forced steps of the policy of `loop_state` (a `Trainer`'s `LoopState`) on reference
    completions; returns (the warmed-up loop state, the losses).

    The update's likelihood objective with its own Adam: the RL optimizer state is left untouched, and
    the KL anchor (if any) becomes the warmed-up policy.
    """
    cfg = trainer.cfg
    batch_size = batch_size or cfg.batch_size
    optimizer = optax.adam(lr or cfg.warmup_sft_lr, eps=cfg.optimizer.eps)
    state = state_lib.init_state(loop_state.train.params, optimizer, trainer.mesh)
    update = step_lib.make_update_fn(cfg, trainer.graphdef, trainer.rest, optimizer, trainer.mesh,
                                     jax.tree.map(lambda x: x.sharding, state),
                                     objective=step_lib.likelihood_objective(cfg))
    stream = PromptStream(trainer.train_examples, rng.seed_of(rng.stream(rng.run_key(cfg.seed), "warmup_prompts")))
    rows = NamedSharding(trainer.mesh, P(None, BATCH_AXES))
    losses = []
    for _ in range(steps):
        examples = stream.take(batch_size)
        if cfg.environment is not None:  # demonstrated episodes: their policy turns trained, observations not
            prompts, answers, masks = zip(*(episode_demonstration(trainer, e) for e in examples))
            batch = supervised_batch(list(prompts), list(answers), trainer.pad_id, list(masks), bucket=True)
        else:
            answers = [reference_completion(trainer.task, trainer.tokenizer, e) for e in examples]
            batch = supervised_batch([trainer.prompt_ids(e) for e in examples], answers, trainer.pad_id)
        # Every process holds the whole batch: each lays its devices' rows out as a global array.
        batch = jax.tree.map(lambda x: jax.make_array_from_callback(x.shape, rows, lambda i, x=x: x[i]), batch)
        with device_memory.reported(cfg, "warm-up update", trainer.mesh), jax.set_mesh(trainer.mesh):
            state, metrics = update(state, batch)
            losses.append(float(metrics["loss"]))
    reference = loop_state.reference
    if reference is not None:  # with LoRA too: the warmed-up adapters (`state.reference_params`)
        reference = jax.tree.map(jnp.copy, state.params)
    behaviour = loop_state.behaviour
    if behaviour is not None:  # one-step-off: the first step samples with the warmed-up policy too
        behaviour = trainer.behaviour_copy(state.params)
    return loop_state._replace(train=loop_state.train._replace(params=state.params), reference=reference,
                               behaviour=behaviour), losses
