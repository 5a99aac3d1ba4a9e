"""A short tour of the kernels: `python -m jaxgrpo.catalog.demo`.

4 prompts x G = 8 completions with random binary rewards (each prompt has its
own success rate; the last is always solved), the advantages of several
registered estimators side by side, DAPO's dynamic-sampling filter, then a
PPO-clip loss on made-up log-probs aggregated in every mode, once on the full
batch and once accumulated over two micro-batches.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import jaxgrpo
from jaxgrpo.kernels import dynamic_sampling_filter

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
SUCCESS_RATES = (0.2, 0.5, 0.8, 1.0)  # one per prompt
NUM_PROMPTS = len(SUCCESS_RATES)
GROUP_SIZE = 8
MAX_LEN = 12


def make_batch(seed: int):
    """Rewards, group ids and made-up token log-probs for 4 prompts x 8 completions."""
    rng = np.random.default_rng(seed)
    group_ids = np.repeat(np.arange(NUM_PROMPTS, dtype=np.int32), GROUP_SIZE)
    rewards = (rng.random(group_ids.shape) < np.asarray(SUCCESS_RATES)[group_ids]).astype(np.float32)
    shape = (NUM_PROMPTS * GROUP_SIZE, MAX_LEN)
    old_logp = -rng.exponential(size=shape).astype(np.float32)  # log-probs of the sampling policy
    logp = old_logp + 0.15 * rng.normal(size=shape).astype(np.float32)  # the policy after a few updates
    lengths = rng.integers(3, MAX_LEN + 1, shape[0])
    mask = (np.arange(MAX_LEN)[None, :] < lengths[:, None]).astype(np.float32)
    return rewards, group_ids, logp, old_logp, mask


@jax.jit
def tour(rewards, group_ids, logp, old_logp, mask):
    """Everything the demo prints, in one jitted function (kernels are pure, so they compose under jit)."""
    advantages = {
        name: jaxgrpo.get_advantage(name)(rewards, group_ids, num_groups=NUM_PROMPTS) for name in ESTIMATORS
    }
    keep = dynamic_sampling_filter(rewards, group_ids, num_groups=NUM_PROMPTS)
    # DAPO's clip-higher: eps_low=0.2, eps_high=0.28.
    per_token, metrics = jaxgrpo.get_loss("ppo_clip")(logp, old_logp, advantages["grpo"], mask, eps_high=0.28)
    aggregated = {}
    half = logp.shape[0] // 2
    for mode in jaxgrpo.AGGREGATION_MODES:
        loss, parts = jaxgrpo.aggregate(per_token, mask, mode)
        # Gradient accumulation: each micro-batch divides by the full batch's denominator.
        denominator = jaxgrpo.aggregation_denominator(mask, mode)
        accumulated = sum(
            jaxgrpo.aggregate(per_token[rows], mask[rows], mode, denominator=denominator)[0]
            for rows in (slice(0, half), slice(half, None))
        )
        aggregated[mode] = (loss, parts.total, parts.denominator, accumulated)
    kl = jaxgrpo.aggregate(jaxgrpo.kl_penalty(logp, old_logp, "k3"), mask)[0]
    return advantages, keep, metrics, aggregated, kl


def row(label: str, values, fmt: str = "{:+6.2f}") -> str:
    return f"  {label:22s}" + " ".join(fmt.format(v) for v in np.asarray(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxgrpo.catalog.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rewards, group_ids, logp, old_logp, mask = make_batch(args.seed)
    advantages, keep, metrics, aggregated, kl = tour(rewards, group_ids, logp, old_logp, mask)

    print(f"Advantages: {NUM_PROMPTS} prompts x G={GROUP_SIZE} completions, binary rewards\n")
    for prompt in range(NUM_PROMPTS):
        rows = group_ids == prompt
        kept = "kept" if bool(np.asarray(keep)[rows].all()) else "dropped by dynamic sampling (all rewards equal)"
        print(f"prompt {prompt} (success rate {SUCCESS_RATES[prompt]:.1f}; {kept})")
        print(row("reward", rewards[rows], "{:6.0f}"))
        for name in ESTIMATORS:
            print(row(name, np.asarray(advantages[name])[rows]))
        print()

    print("PPO-clip loss (DAPO clip-higher: eps_low=0.2, eps_high=0.28) with GRPO advantages")
    print("  " + ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(metrics.items())) + "\n")
    print(f"  {'aggregation mode':26s}{'loss':>10s}{'total':>10s}{'denom':>8s}{'2 micro-batches':>18s}")
    for mode in jaxgrpo.AGGREGATION_MODES:
        loss, total, denominator, accumulated = aggregated[mode]
        print(f"  {mode:26s}{float(loss):10.4f}{float(total):10.4f}{float(denominator):8.0f}{float(accumulated):18.4f}")
    print(f"\n  k3 KL to the sampling policy (token mean): {float(kl):.4f}")
    print("\nEvery registered kernel: jaxgrpo.list_kernels(); reference: docs/kernels.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
