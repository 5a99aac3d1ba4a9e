"""Two steps of every experiment file on the tiny model and the toy task, with a fixed seed: the metrics
recorded in tests/support/experiment_metrics.json (before the trainer was split into jaxgrpo/train/; files
added since, when they were added), which `test_experiments_reproduce_metrics.py` checks the current code
still reproduces.

Regenerate (only when a change is meant to alter the numbers), or record a new file by its name:
    PYTHONPATH=. python tests/support/experiment_metrics.py [NAME ...]
"""

import json
import os
import sys

import numpy as np

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
EXPERIMENTS = os.path.join(ROOT, "experiments")
RECORD = os.path.join(ROOT, "tests", "support", "experiment_metrics.json")
#: Metrics that measure the machine rather than the method.
TIMING = ("time_", "tokens_per_s")


def first_char_parity(completions, examples):
    """1 when the completion's first character has an odd code point: an untrained model's samples
    split about evenly, so nearly every group carries signal (the toy task's own reward, a 1-in-45
    guess for a random model, can leave a whole step without any)."""
    return np.array([float(bool(c) and ord(c[0]) % 2 == 1) for c in completions], np.float32)


def tiny_overrides(cfg, run_dir) -> tuple[list[str], list | None]:
    """The overrides (and reward functions) that run an experiment on the tiny model and the toy task."""
    overrides = ["model=toy-tiny", "task.name=toy_sum", "task.kwargs={}", "task.num_eval_examples=0",
                 "steps=2", "warmup_sft_steps=0", "sampling.max_new_tokens=3", "checkpoint_every=0",
                 "seed=0", f"run_dir={run_dir}"]
    reward_fns = None
    if cfg.rewards:  # experiments with their own rewards (GDPO) keep them; correctness from the first
        overrides.append(f"correctness_reward={next(iter(cfg.rewards))}")
    else:
        reward_fns = [(first_char_parity, 1.0)]
        overrides.append("correctness_reward=first_char_parity")
    if cfg.group_size > 1:
        overrides += ["prompts_per_step=8", f"group_size={5 if cfg.loss_mask else 4}"]
    if cfg.reward_penalty == "overlong_penalty":  # a window inside the 3 new tokens
        overrides.append("reward_penalty_kwargs.cache_len=2")
    return overrides, reward_fns


#: How far a recorded metric may move when the CPU changes, by the parameter dtype of the run: (rtol, atol).
#: float32: the recorded runs reproduce to a few float32 roundings on every CPU family (Xeon with AMX, AMD EPYC
#: with and without AVX-512): rtol 1e-4 is ~1000 float32 epsilons, room for a different summation order in the
#: products over two steps. bfloat16: each product's output is rounded to 8 significant bits (epsilon 2^-8 =
#: 3.9e-3), and CPUs with and without AMX-BF16 accumulate those products differently, so a metric moves by a few
#: bfloat16 epsilons: rtol 2e-2 (~5 epsilons). The metrics that *are* rounding -- the sampler-trainer log-prob
#: gap, the KL estimates and the loss of an on-policy step, all near 0 -- move by a fraction of a bfloat16
#: epsilon in log-prob units, hence atol 1e-3 (on an EPYC `logp_gap` was 6.49e-4 where a Xeon recorded 6.41e-4).
#: A different sampled token still fails: it moves accuracy and rewards by 1/32 or more.
TOLERANCE = {"float32": (1e-4, 1e-6), "bfloat16": (2e-2, 1e-3)}


def tolerance(cfg) -> tuple[float, float]:
    """(rtol, atol) for comparing a run of `cfg` with its recorded metrics (see `TOLERANCE`)."""
    return TOLERANCE[cfg.dtype]


def experiment_names() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(EXPERIMENTS) if f.endswith(".py"))


def comparable(record: dict) -> dict:
    return {k: float(v) for k, v in record.items() if not any(t in k for t in TIMING)}


if __name__ == "__main__":
    import tempfile

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from jaxgrpo.config import apply_overrides, load_experiment
    from jaxgrpo.train import Trainer

    names = sys.argv[1:] or experiment_names()
    recorded = json.load(open(RECORD)) if os.path.exists(RECORD) else {}
    for name in names:
        cfg = load_experiment(os.path.join(EXPERIMENTS, name + ".py"))
        with tempfile.TemporaryDirectory() as tmp:
            overrides, reward_fns = tiny_overrides(cfg, os.path.join(tmp, "run"))
            apply_overrides(cfg, overrides)
            history = Trainer(cfg, reward_fns=reward_fns).run(progress=False)
        recorded[name] = [comparable(r) for r in history]
        print(name, recorded[name][-1]["loss"], flush=True)
    with open(RECORD, "w") as f:
        json.dump(recorded, f, indent=1, sort_keys=True)
