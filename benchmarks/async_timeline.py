"""The loop's timeline, synchronous against one-step-off (`max_staleness` 0 and 1), on the offline toy task.

    python benchmarks/async_timeline.py [--steps 8] [--out docs/trainer_async_timeline.png]
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/async_timeline.py --rollout-devices 4

Runs the toy experiment (experiments/toy_sum.py: its warm-up, then `--steps` steps of 8 prompts x 8 samples)
once with each setting, alternating which goes first over `--repeats` pairs, and reads each step's phases from
its metrics: `time_at_sample_start/end` (the rollout the step learns from) and `time_at_learn_start/end` (its
advantages and updates), seconds on the trainer's clock. Plots one run of each as bars per step from the third
on (sampling above, learning below) and prints the median step time after the first (which compiles) and how much of the learning
time had sampling running beside it. On a CPU the two phases share the same cores, so overlap shows the pipeline
working, not a speed-up; where sampler and learner have devices (or host work) of their own the overlapped time
is what one-step-off saves. `--rollout-devices k` gives the one-step-off run's sampler the last k devices
(`mesh.rollout_devices`; with fake CPU devices, as the second command line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(max_staleness: int, steps: int, directory: str, rollout_devices: int = 0) -> list[dict]:
    from jaxgrpo.config import apply_overrides, load_experiment
    from jaxgrpo.train import Trainer

    cfg = load_experiment(os.path.join(ROOT, "experiments", "toy_sum.py"))
    apply_overrides(cfg, [f"run_dir={directory}", f"steps={steps}", f"max_staleness={max_staleness}",
                          "task.num_eval_examples=0", "checkpoint_every=0",
                          f"mesh.rollout_devices={rollout_devices if max_staleness else 0}"])
    return Trainer(cfg).run(progress=False)


def overlap(history: list[dict]) -> float:
    """The share of the learning time (after the first step) during which a rollout was being sampled."""
    learning, shared = 0.0, 0.0
    samples = [(r["time_at_sample_start"], r["time_at_sample_end"]) for r in history]
    for record in history[1:]:
        start, end = record["time_at_learn_start"], record["time_at_learn_end"]
        learning += end - start
        shared += sum(max(0.0, min(end, b) - max(start, a)) for a, b in samples)
    return shared / learning if learning else 0.0


def plot(runs: dict[int, list[dict]], path: str, split: int = 0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.6 + 1.2 * len(runs)))
    for ax, (staleness, history) in zip(axes, sorted(runs.items())):
        history = history[2:]  # from step 3: the first step compiles, and one-step-off samples step 2 beside it
        origin = min(min(r["time_at_sample_start"], r["time_at_learn_start"]) for r in history)
        for record in history:
            ax.barh(1, record["time_at_sample_end"] - record["time_at_sample_start"],
                    left=record["time_at_sample_start"] - origin, color="tab:blue", edgecolor="white")
            ax.barh(0, record["time_at_learn_end"] - record["time_at_learn_start"],
                    left=record["time_at_learn_start"] - origin, color="tab:orange", edgecolor="white")
            ax.text(record["time_at_learn_start"] - origin, -0.45, str(record["step"]), fontsize=7)
        ax.set_yticks([0, 1], ["learn", "sample"])
        ax.set_title(f"max_staleness={staleness}" + (" (synchronous)" if not staleness else " (one-step-off)")
                     + (f", sampler on {split} device(s) of its own" if staleness and split else ""), fontsize=9)
    axes[-1].set_xlabel("seconds from step 3 on (the first compiles); toy task, step numbers under the bars")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rollout-devices", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "trainer_async_timeline.png"))
    args = parser.parse_args()

    runs: dict[int, list[list[dict]]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for staleness in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                runs[staleness].append(run(staleness, args.steps, os.path.join(tmp, f"{staleness}-{repeat}"),
                                           args.rollout_devices))
    print("| max_staleness | median step s (after the first) | learning time with sampling beside it | staleness |")
    print("|---|---|---|---|")
    for staleness, histories in sorted(runs.items()):
        times = [r["time_step"] for h in histories for r in h[1:]]
        shares = [overlap(h) for h in histories]
        lag = [r.get("staleness_max", 0.0) for h in histories for r in h]
        print(f"| {staleness} | {statistics.median(times):.2f} | {statistics.median(shares):.0%} | "
              f"max {max(lag):.0f} |")
    plot({s: h[0] for s, h in runs.items()}, args.out, args.rollout_devices)
    print(f"timeline: {args.out}")


if __name__ == "__main__":
    main()
