"""The driver of a run: its run directory, resume or start, the supervised warm-up, then step after step with
metrics, held-out evaluation, checkpoints and profiling around `Trainer.step` (`Trainer.run` calls `run`)."""

from __future__ import annotations

import logging
import os
from typing import Callable

import jax

from jaxgrpo import profiling
from jaxgrpo.config import Config, to_dict
from jaxgrpo.errors import ConfigError
from jaxgrpo.train import evaluation, state as state_lib
from jaxgrpo.train import warmup as warmup_lib
from jaxgrpo.train.health import RunWatch
from jaxgrpo.train.state import LoopState

logger = logging.getLogger(__name__)


def run(trainer, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
        on_step: Callable[[int, dict], None] | None = None, profile: int = 0) -> list[dict]:
    """`trainer.run(...)`: trains for `cfg.steps` steps into `cfg.run_dir` and returns the records of the steps it
    ran (`Trainer.run` says what each argument does, when a run is refused and when it stops)."""
    from jaxgrpo.run.checkpoint import Checkpointer
    from jaxgrpo.run.metrics import EVAL_FILE, MetricsWriter
    from jaxgrpo.run.rundir import RunDirectory

    cfg = trainer.cfg
    config = to_dict(cfg)
    with RunDirectory.open(cfg.run_dir, config, resume=resume, overwrite=overwrite,
                           defaults=to_dict(Config())) as run_directory:
        writer = MetricsWriter(cfg.run_dir)
        checkpointer = Checkpointer(os.path.join(cfg.run_dir, "checkpoints"), keep=cfg.keep_checkpoints)
        tracer = None
        try:
            state = _start(trainer, checkpointer, writer, resume)
            if profile:
                tracer = _tracer(trainer, state.step, profile, write=writer.enabled)
            run_directory.write_config(config)  # the run can start: this is now the config of its checkpoints
            if state.step == 0 and cfg.warmup_sft_steps:
                state, losses = warmup_lib.supervised_warmup(trainer, state, cfg.warmup_sft_steps)
                if writer.enabled:  # process 0 speaks for a multi-host run
                    print(f"supervised warm-up: {cfg.warmup_sft_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
            trainer.loop_state = state  # what evaluation samples from
            evaluating = bool(trainer.eval_examples and cfg.eval_every)
            if state.step == 0 and evaluating:
                writer.write(0, evaluate(trainer, 0), file=EVAL_FILE, prefix="eval/")
            history, watch = [], RunWatch(cfg, warn=writer.enabled)
            bar = _progress(range(state.step, cfg.steps), enabled=progress and writer.enabled,
                            initial=state.step, total=cfg.steps)
            for _ in bar:
                if tracer is not None:
                    tracer.begin(state.step + 1)
                state, metrics = trainer.step(state, last=state.step + 1 == cfg.steps)
                trainer.loop_state = state
                done = state.step
                record = writer.write(done, metrics, log=done % cfg.log_every == 0 or done == cfg.steps)
                history.append(record)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc=f"{record['accuracy']:.2f}",
                                    s_per_step=f"{record['time_step']:.1f}")
                watch.after(done, history)
                if evaluating and (done % cfg.eval_every == 0 or done == cfg.steps):
                    with profiling.phase("evaluate"):
                        writer.write(done, evaluate(trainer, done), file=EVAL_FILE, prefix="eval/")
                if cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                    with profiling.phase("checkpoint"):
                        state_lib.save(checkpointer, state)
                if on_step is not None:
                    on_step(done, record)
                if tracer is not None and (summary := tracer.end(done)):
                    logger.warning("profile of steps %d-%d: %s (the trace beside it opens in Perfetto or "
                                   "TensorBoard's profiler)", tracer.first, tracer.last, summary)
            return history
        finally:
            if tracer is not None:
                tracer.close()
            checkpointer.close()
            writer.close()


def evaluate(trainer, step: int) -> dict:
    """The held-out metrics of the policy after `step` steps (`evaluation.evaluate`, or `evaluate_episodes`
    with an environment)."""
    if trainer.cfg.environment is not None:
        return evaluation.evaluate_episodes(trainer.cfg, trainer.run_episodes, trainer.eval_examples, step)
    return evaluation.evaluate(trainer.cfg, trainer.generate, trainer.tokenizer, trainer.reward_fns,
                               trainer.eval_examples, step)


def _tracer(trainer, start: int, count: int, *, write: bool) -> profiling.StepTracer:
    """A tracer of the `count` steps after step `start + 1` (the run's first, which compiles)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"profile must be a number of steps >= 0, got {count!r}")
    if start + 1 + count > trainer.cfg.steps:
        raise ConfigError(f"profile={count} traces steps {start + 2}-{start + 1 + count} (the run's first step, "
                          f"{start + 1}, compiles), but the run ends at step {trainer.cfg.steps}; raise steps or "
                          f"profile fewer")
    directory = os.path.join(trainer.cfg.run_dir, "profile")
    if jax.process_count() > 1:
        directory = os.path.join(directory, f"process_{jax.process_index()}")
    return profiling.StepTracer(directory, start + 2, count, write=write)


def _start(trainer, checkpointer, writer, resume: bool) -> LoopState:
    """The state the run starts from: under `resume` the newest checkpoint's, else `loop_state` at step 0 (a
    trainer's first run: its initial state)."""
    restored = state_lib.restore(checkpointer, trainer.loop_state) if resume else None
    if restored is None and resume and writer.enabled:
        print(f"--resume: no checkpoint in {checkpointer.directory}; starting from step 0")
    if resume:  # records after the checkpoint (all of them from step 0) are written again
        writer.truncate_after(restored.step if restored is not None else -1)
    return trainer.loop_state._replace(step=0) if restored is None else restored


def _progress(iterable, *, enabled: bool, initial: int, total: int):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, initial=initial, total=total, desc="train", dynamic_ncols=True)
