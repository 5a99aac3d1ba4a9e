"""SPO, single-stream (METHODS.md §3): "Qwen3-8B, +3.4 pp average maj@32 over GRPO".

GRPO's group-normalized advantage against SPO's (experimental) baseline-subtracted, batch-normalized
advantage, on the toy sum.
"""

from jaxgrpo.study import Study


def study() -> Study:
    return Study(
        name="spo_single_stream",
        experiment="../experiments/toy_sum.py",
        claim="SPO's advantage reaches a higher held-out accuracy than GRPO's",
        paper="SPO (single-stream): Qwen3-8B, +3.4 pp average maj@32 over GRPO",
        methods={"grpo": {}, "spo": {"advantage": "experimental/spo_advantage"}},
        seeds=[0, 1, 2],
        metrics=["eval/pass@1", "eval/greedy_accuracy", "accuracy"],
        overrides={"eval_every": 10, "checkpoint_every": 20},
    )
