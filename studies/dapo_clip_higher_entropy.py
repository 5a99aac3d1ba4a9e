"""DAPO's clip-higher (DAPO: An Open-Source LLM Reinforcement Learning System at Scale, 2025, section 3.1):
raising the upper clip bound from 1 + 0.2 to 1 + 0.28 lets low-probability tokens rise, which the paper reports
keeps the policy's entropy from collapsing during training (the abstract gives only the AIME figure, 50 points
with Qwen2.5-32B).

PPO clipping acts only when the ratio leaves 1, so both arms take 16 updates per step, as many as DAPO's recipe
per rollout batch (here 2 epochs of 8 minibatches of one group each; all but the first off-policy); they differ
only in eps_high. The claim holds here if clip-higher's training entropy stays above GRPO's (final value, paired
by seed) at no loss of held-out pass@1.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="dapo_clip_higher_entropy",
        experiment="../experiments/toy_sum.py",
        claim="clip-higher (eps_high 0.28 instead of 0.2) keeps the training entropy higher than symmetric clipping",
        paper="DAPO: clip-higher (eps_low 0.2, eps_high 0.28) prevents the entropy collapse of symmetric clipping "
              "(section 3.1; no number in the abstract)",
        methods={"grpo_clip": {"loss_kwargs.eps_high": 0.2}, "clip_higher": {"loss_kwargs.eps_high": 0.28}},
        seeds=[0, 1, 2, 3, 4],
        metrics=["entropy", "clip_fraction_high", "eval/pass@1", "accuracy"],
        overrides={"num_epochs": 2, "num_minibatches": 8, "loss_kwargs.eps_low": 0.2,
                   "eval_every": 10, "checkpoint_every": 20},
    )
