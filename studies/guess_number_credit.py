"""The number game (experiments/guess_number.py) learns under GRPO and under GiGPO, over five seeds.

SmolLM2-135M-Instruct guesses a number from 1 to 20 in up to 6 turns with higher/lower feedback; the held-out
success is one greedy episode per each of 32 secrets the training never sees, and pass@1 / pass@4 of four
sampled ones. GiGPO (Feng et al., 2025) adds to GRPO's episode-level group advantage a step-level one over the
turns that act from the same revealed interval (`GuessNumber.state()`), by discounted return (0.95).

The claim holds if each method's change in held-out success over the run (final minus step 0, paired within
each seed's run: report.md's "Change over the run" table) has a 95% t-interval above 0. GiGPO against GRPO is
reported too (the paper's comparison, on ALFWorld and WebShop), but is not expected to be resolved.

A cell is 20 steps of 4 prompts x 4 episodes (~70-80 s a step on a 2-core CPU) and three evaluations (steps 0,
10 and 20), about 30 minutes. Ten steps resolved neither rise; twenty steps over three seeds resolved GRPO's and
not GiGPO's (one seed fell back), hence five seeds; GiGPO's five resolve it (docs/studies.md).
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="guess_number_credit",
        experiment="../experiments/guess_number.py",
        claim="the number game's held-out success rises under GRPO and under GiGPO (episode and step-level credit)",
        paper="GiGPO: step-level credit from anchor states adds >12% (ALFWorld) and >9% (WebShop) over GRPO with "
              "Qwen2.5-1.5B/7B; no figure for a guessing game",
        methods={"grpo": {}, "gigpo": {"advantage": "gigpo"}},
        seeds=[0, 1, 2, 3, 4],
        metrics=["eval/greedy_accuracy", "eval/pass@1", "eval/pass@4", "reward_mean", "episode_turns"],
        overrides={"steps": 20, "prompts_per_step": 4, "group_size": 4, "micro_batch_size": 16,
                   "task.num_eval_examples": 32, "eval_every": 10, "checkpoint_every": 5},
    )
