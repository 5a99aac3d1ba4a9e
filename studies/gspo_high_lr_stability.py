"""GSPO (Group Sequence Policy Optimization, 2025): "stable, efficient, and performant ... superior training
efficiency and performance compared to the GRPO algorithm, notably stabilizes Mixture-of-Experts RL training"
(abstract; no number there).

GRPO's token-ratio clipping against GSPO's sequence-ratio clipping (the paper's eps 3e-4 / 4e-4), at the toy's
learning rate and at 10x it, each step 16 updates (as many as DAPO's recipe; here 2 epochs of 8 minibatches)
so the ratios leave 1 and clipping acts. The claim holds here if, going from lr 1e-3 to 1e-2, GSPO loses less
held-out pass@1 than GRPO (the drops paired by seed). A dense 2-layer model has no experts: this tests only the
sequence-ratio part of the claim.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="gspo_high_lr_stability",
        experiment="../experiments/toy_sum.py",
        claim="GSPO keeps more of its held-out pass@1 than GRPO when the learning rate is raised 10x",
        paper="GSPO: stable, efficient and performant; superior training efficiency and performance to GRPO; "
              "stabilizes MoE RL training (abstract, no number)",
        methods={"grpo": {}, "gspo": {"loss": "gspo"}},
        grid={"optimizer.lr": [1e-3, 1e-2]},
        seeds=[0, 1, 2, 3, 4],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy", "entropy", "clip_fraction"],
        overrides={"num_epochs": 2, "num_minibatches": 8, "eval_every": 10, "checkpoint_every": 20},
    )
