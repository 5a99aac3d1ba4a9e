"""NGRPO (NGRPO: Negative-enhanced Group Relative Policy Optimization, 2025): GRPO's advantage is zero in a group
whose answers are all wrong, so those groups teach nothing; NGRPO adds a virtual sample of the maximum reward to
each group's mean and std, so all-wrong answers get A < 0 and are pushed down. The abstract gives no number:
"significantly outperforms PPO, GRPO, DAPO and PSR-NSR on MATH500, AMC23 and AIME2025" (Qwen2.5-Math-7B).

A setting where most groups are all wrong: the full toy sum (a, b in 0..9, 100 questions) after the same short
warm-up, groups of 4 (about 3 groups in 4 all wrong at the start). NGRPO's advantage against GRPO's; one update
per step, so NGRPO's asymmetric clip (0.16 / 0.24) would be inactive and is left out. The claim holds here if
NGRPO's held-out pass@1 ends above GRPO's (paired by seed). At the toy's 60 steps neither arm learns much
here, so the grid adds a run 5x as long.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="ngrpo_all_wrong_groups",
        experiment="../experiments/toy_sum.py",
        claim="with most groups all wrong, NGRPO's advantage calibration learns more than GRPO "
              "(higher held-out pass@1)",
        paper="NGRPO: significantly outperforms PPO, GRPO, DAPO and PSR-NSR on MATH500, AMC23, AIME2025 "
              "(Qwen2.5-Math-7B; no number in the abstract)",
        methods={"grpo": {}, "ngrpo": {"advantage": "ngrpo"}},
        grid={"steps": [60, 300]},
        seeds=[0, 1, 2, 3, 4],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy", "frac_all_wrong"],
        overrides={"task.kwargs.max_operand": 9, "group_size": 4, "eval_every": 10, "checkpoint_every": 20},
    )
