"""Dr. GRPO (Understanding R1-Zero-Like Training: A Critical Perspective, 2025): GRPO divides each answer's loss
by its own length, so a long wrong answer is penalized less per token than a short one, which lets wrong answers
grow; Dr. GRPO divides by a constant (and drops the std normalization of the advantage), "an unbiased
optimization method that improves token efficiency while maintaining reasoning performance" (abstract).

The toy's reward reads only the first character, so what follows it is free: completions of up to 8 tokens,
where the warm-up teaches a digit and then the end token (2 tokens). GRPO (seq_mean_token_mean) against Dr. GRPO
(dr_grpo advantage, seq_mean_token_sum_norm with L = 8), run 200 steps so lengths have time to drift.
`metrics.jsonl` logs the mean length of all completions, not of the wrong ones alone, so the claim is tested
on all of them. It holds here if Dr. GRPO's final mean completion length is below GRPO's (paired by seed) at
no loss of held-out pass@1.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="dr_grpo_length",
        experiment="../experiments/toy_sum.py",
        claim="Dr. GRPO's constant normalizer keeps completions shorter than GRPO's per-answer length normalization, "
              "at equal held-out pass@1",
        paper="Dr. GRPO: an unbiased optimization method that improves token efficiency while maintaining reasoning "
              "performance (abstract; GRPO's bias lengthens wrong answers most)",
        methods={"grpo": {}, "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq_mean_token_sum_norm"}},
        seeds=[0, 1, 2, 3, 4],
        metrics=["completion_length", "frac_truncated", "eval/pass@1", "accuracy"],
        overrides={"sampling.max_new_tokens": 8, "steps": 200, "eval_every": 20, "checkpoint_every": 50},
    )
