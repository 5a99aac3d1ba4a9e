"""MC-GRPO (headline numbers of the method catalog):
"gap between G=2 and G=8 reduced to within 1%" (median-centred advantages).

GRPO and MC-GRPO at a small and a large group on the toy sum; MC-GRPO samples G + 1 so the median is a
sample (left out of the loss). The claim holds here if MC-GRPO's G=2 minus G=8 gap in eval pass@1 is
smaller than GRPO's and within 0.01.
"""

from jaxgrpo.evaluation.study import Study

MC = {"advantage": "mc_grpo", "loss_mask": "mc_grpo_pivot_mask"}


def study() -> Study:
    return Study(
        name="mc_grpo_small_groups",
        experiment="../experiments/toy_sum.py",
        claim="MC-GRPO's gap between G=2 and G=8 is within 1 point of accuracy; GRPO's is larger",
        paper="MC-GRPO: gap between G=2 and G=8 reduced to within 1% (abstract)",
        methods={"grpo_G8": {"group_size": 8}, "grpo_G2": {"group_size": 2},
                 "mc_grpo_G8": {**MC, "group_size": 9}, "mc_grpo_G2": {**MC, "group_size": 3}},
        seeds=[0, 1, 2],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy"],
        overrides={"eval_every": 10, "checkpoint_every": 20},
    )
