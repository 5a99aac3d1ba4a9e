"""Balanced online difficulty filtering (headline numbers of the method catalog):
"+10% AIME and +4% average over plain GRPO; beats
GRPO's maximum reward within 60% of the training time".

Plain GRPO against GRPO that drops all-right / all-wrong groups and samples more
(`group_filter="dynamic_sampling_filter"`, up to 3 rounds), on the toy sum. The time claim is read from the
curves of the training accuracy.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="online_difficulty_filtering",
        experiment="../experiments/toy_sum.py",
        claim="filtering groups without signal raises held-out accuracy over plain GRPO and reaches GRPO's best "
              "training accuracy in at most 60% of the steps",
        paper="Balanced online difficulty filtering: +4% average over plain GRPO; GRPO's maximum reward within 60% "
              "of the training time",
        methods={"grpo": {}, "filtered": {"group_filter": "dynamic_sampling_filter", "max_sampling_rounds": 3}},
        seeds=[0, 1, 2],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy", "frac_trained_rows"],
        overrides={"eval_every": 10, "checkpoint_every": 20},
    )
