"""XRPO (headline numbers of the method catalog):
"up to +4% pass@1 and +6% cons@32 over GRPO/GSPO; up to 2.7x faster convergence".

Only XRPO's advantage sharpening is implemented (the rollout allocator needs the sampler): GRPO's advantage
against XRPO's, on the toy sum. Convergence is read from the curves.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="xrpo_convergence",
        experiment="../experiments/toy_sum.py",
        claim="XRPO's advantage sharpening raises pass@1 over GRPO and reaches GRPO's final training accuracy sooner",
        paper="XRPO: up to +4% pass@1 over GRPO/GSPO; up to 2.7x faster convergence",
        methods={"grpo": {}, "xrpo": {"advantage": "xrpo"}},
        seeds=[0, 1, 2],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy"],
        overrides={"eval_every": 10, "checkpoint_every": 20},
    )
