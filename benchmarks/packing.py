"""The trainer's update with packed prompt groups against padded rows, side by side on real rollouts.

    python benchmarks/packing.py [--rollouts 3] [--max-new-tokens 128] [--micro-batch 8]
    python benchmarks/packing.py --experiment experiments/guess_number.py --set prompts_per_step=4 group_size=4 \
        micro_batch_size=16

The setting is the GRPO step benchmark's (benchmarks/grpo_step_vs_trl.py): SmolLM2-135M-Instruct,
8 arithmetic prompts x G=4, at most 128 new tokens at temperature 1, micro-batches of 8 completions,
one AdamW update. For each of `--rollouts` batches sampled by the policy, the same update runs from
the same state twice, alternating which goes first: `packing=True` (each micro-batch scored as
packed prompt groups, `jaxgrpo.models.packing`) and `packing=False` (padded rows [prompt,
completion]). Compilation is excluded (each program runs once untimed first). Prints a markdown
table: the slots the forwards process (padded rows; packed rows as `packing.plan_rows` lays the
groups out; what the groups need), the update seconds, the per-batch ratio, and the loss difference
between the two (they compute the same loss).

`--experiment FILE [--set KEY=VALUE ...]` times that experiment's batches instead (e.g. environment episodes,
whose completions hold the observations; `--micro-batch` is then its `micro_batch_size`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiment", help="an experiment file to take the config from instead")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of --experiment's config")
    args = parser.parse_args()

    from grpo_step_vs_trl import jaxgrpo_config

    from jaxgrpo.models import packing
    from jaxgrpo.rewards import correctness_reward
    from jaxgrpo.train import Trainer
    from jaxgrpo.train.batch import packed_trees

    if args.experiment:
        from jaxgrpo.config import apply_overrides, load_experiment

        cfg = load_experiment(args.experiment)
        apply_overrides(cfg, [*args.set, f"seed={args.seed}", "eval_every=0", "checkpoint_every=0",
                              "task.num_eval_examples=0"])
        args.micro_batch = cfg.micro_batch_size or cfg.batch_size
        trainer = Trainer(cfg)
    else:
        cfg = jaxgrpo_config(8, 4, args.max_new_tokens, args.seed, args.micro_batch)
        trainer = Trainer(cfg, reward_fns=[(correctness_reward, 1.0)])
    cfg = trainer.cfg  # packing settled for the platform: set per update below
    start_state = jax.tree.map(np.asarray, trainer.state)

    def timed_update(batch, packed: bool, program, compiled: set) -> tuple[float, float]:
        """The update's seconds and loss, `program` the packed shape it compiles (None padded)."""
        cfg.packing = packed
        program = program if packed else None
        runs = 1 if program in compiled else 2  # the first run of a program compiles it
        compiled.add(program)
        for _ in range(runs):
            train = jax.tree.map(lambda x, s: jax.device_put(x, s), start_state, trainer.state_sharding)
            start = time.perf_counter()
            train, metrics = trainer.update(train, batch)
            jax.block_until_ready(train.params)
            seconds = time.perf_counter() - start
        return seconds, metrics["loss"]

    rows, ratios, compiled = [], [], set()
    for i in range(args.rollouts):
        cfg.packing = True
        rollout, _, _ = trainer.rollout(trainer.loop_state, jax.random.key(args.seed + i))
        batch = trainer.advantages(trainer.loop_state, rollout)
        width = batch.tokens.shape[1]
        trees = packed_trees(cfg, batch)
        _, plan = packing.plan_rows(np.arange(cfg.batch_size), trees.lengths, trees.size, args.micro_batch,
                                    attention_scale=trainer.attention_scale)
        micro_batches = cfg.batch_size // args.micro_batch
        order = (True, False) if i % 2 == 0 else (False, True)
        program = (plan.rows, plan.length, trees.size)  # the trainer's packed shape (`batch.minibatches`)
        result = {mode: timed_update(batch, mode, program, compiled) for mode in order}
        (packed_s, packed_loss), (padded_s, padded_loss) = result[True], result[False]
        ratios.append(padded_s / packed_s)
        rows.append(
            f"| {i} | {int(rollout.completion_mask.sum(-1).mean())} | {len(batch.tokens)} x {width} = {len(batch.tokens) * width} "
            f"| {micro_batches} x {plan.rows} x {plan.length} = {micro_batches * plan.rows * plan.length} "
            f"| {trees.lengths.sum()} ({trees.lengths.min()}-{trees.lengths.max()}) | {padded_s:.1f} | {packed_s:.1f} | {padded_s / packed_s:.2f}x | {abs(packed_loss - padded_loss):.1e} |"
        )
        print(f"batch {i}: padded {padded_s:.1f} s, packed {packed_s:.1f} s", file=sys.stderr, flush=True)

    print(f"Update of {cfg.prompts_per_step} prompts x G={cfg.group_size} ({args.experiment or cfg.model}, "
          f"{cfg.dtype}, at most {cfg.sampling.max_new_tokens} new tokens a turn, micro-batches of {args.micro_batch}, "
          f"packed trees of {trees.size} rows), {jax.device_count()} {jax.devices()[0].platform} device(s).\n")
    print("| batch | mean completion tokens | padded slots | packed slots (micro x rows x length) | slots the trees need (per tree) "
          "| padded s | packed s | speed-up | loss diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"| median | | | | | | | {statistics.median(ratios):.2f}x | |")


if __name__ == "__main__":
    main()
