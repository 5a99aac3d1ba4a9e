"""One-step-off rollouts against the synchronous loop on the main job (`experiments/quickstart.py`), three seeds.

With `max_staleness=1` each step learns from the rollout the policy one update back sampled while the previous
step learned (docs/trainer.md, "One-step-off rollouts"): every trained token is one update stale, the PPO ratio
anchored at the learner's own log-probs. verl, NeMo-RL and TRL report one-step-off training reaching the
synchronous run's accuracy at a lower step time; the claim tested here is the first half: the main job's
held-out greedy accuracy after 30 steps with `max_staleness=1` lies within the seeds' spread of the synchronous
run's (report.md: each configuration's mean with a t-interval over seeds, and the paired difference).

A cell is the main job as the README runs it (30 steps of 8 prompts x 8 samples, 300 held-out questions before and
after): about 30 CPU minutes on a 2-core EPYC, so the six cells take a few hours; the runner resumes.
"""

from jaxgrpo.evaluation.study import Study


def study() -> Study:
    return Study(
        name="one_step_off_main_job",
        experiment="../experiments/quickstart.py",
        claim="one-step-off rollouts (max_staleness=1) reach the synchronous loop's held-out accuracy within the "
              "seeds' spread",
        paper="verl one-step-off / fully async (2.35-2.67x step time on Qwen2.5-7B), NeMo-RL (1.58x per GPU on "
              "Llama-3.1-8B): accuracy on par with synchronous training",
        methods={"synchronous": {}, "one_step_off": {"max_staleness": 1}},
        seeds=[0, 1, 2],
        metrics=["eval/greedy_accuracy", "eval/greedy_format_only", "reward_mean", "staleness_mean"],
        overrides={},
    )
