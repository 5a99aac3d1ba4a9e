"""Training: the state a checkpoint holds, the pure jitted update, rollouts, the run's health checks, the loop.

* `state`: `TrainState`, the policy (LoRA-adapted with `adapt`), the optimizer, the mesh, checkpoints.
* `step`: the pure update `(TrainState, TrainBatch) -> (TrainState, metrics)` and its loss.
* `rollout`: sampling, scoring and dynamic sampling of a step's groups (`Trajectories`).
* `batch`: a scored rollout to the update's `TrainBatch` (advantages, reference log-probs, GAE).
* `inputs`, `stages`: the fields a kernel can read and the stages that select kernels by name.
* `trackers`: stateful kernels, their per-prompt state kept in `TrainState.kernel_state`.
* `warmup`, `evaluation`: supervised warm-up batches; held-out accuracy and pass@k.
* `health`: the run's checks after each step (no learning signal, updates not applied, signs of collapse).
* `preflight`: what a `Trainer` is given, checked before anything is built.
* `loop`: `Trainer`, which runs a `Config`; `driver`: `Trainer.run` around its steps.

Submodules load on first use, so a module that needs one part (e.g. `stages`) does not load the loop's.
Multi-host helpers are `jaxgrpo.distributed`, below the sampler.
"""

import importlib

_EXPORTS = {
    "Trainer": "loop", "NoLearningSignal": "health", "NonFiniteUpdates": "health",
    "TrainState": "state", "Policy": "state", "ValueHead": "state", "make_optimizer": "state",
    "build_model": "state", "make_mesh": "state", "register_model_builder": "state", "MODEL_BUILDERS": "state",
    "LoopState": "state", "rollout_mesh": "state", "process_sampler_mesh": "state",
    "adapt": "state", "trainable": "state",
    "TrainBatch": "step", "Objective": "step", "make_update_fn": "step", "make_loss_fn": "step",
    "completion_outputs": "step",
    "Trajectories": "rollout", "RowStats": "rollout", "PromptStream": "rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"jaxgrpo.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'jaxgrpo.train' has no attribute {name!r}")
