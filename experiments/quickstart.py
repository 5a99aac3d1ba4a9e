"""The main job: GRPO on SmolLM2-135M-Instruct (embedded GGUF) and procedural arithmetic, on CPU.

One-digit sums of three numbers ("What is 4 + 7 + 9?"): 1000 possible questions, half of them held out
(`test_share=2`), so the 300 evaluation examples hold 216 distinct questions that training never sees.
`jaxgrpo-train experiments/quickstart.py` evaluates them greedily before and after training (accuracy,
and the shares of well-formed and of well-formed-but-wrong answers) and prints where its curves and
checkpoints are. About 12 minutes on an idle 2-core Xeon with AMX, 20-30 on an AVX2-only CPU; the held-out
accuracy it reaches, and how it varies with the host and seed, are in the README ("The main job").
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.model = "smollm2-135m-instruct"
    c.task.name = "arithmetic"  # "Finish your reply with 'The answer is N.'"
    c.task.kwargs = {"digits": 1, "operands": 3, "test_share": 2}
    c.task.num_eval_examples = 300
    c.advantage = "grpo"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.prompts_per_step, c.group_size = 8, 8
    c.micro_batch_size = 16  # exact gradient accumulation; bounds activation memory to a few GB
    c.sampling.temperature = 1.0
    c.sampling.max_new_tokens = 16  # "The answer is N." takes ~7 tokens; a cut-off reply is scored on what it stated
    # A cosine decay from 2e-5 to 2e-6 over the 30 steps, where a constant 3e-5 collapsed (seed 0: 0.090 -> 0.030)
    # and a constant 1.5e-5 stayed within the base's interval. Not robust yet: two seeds in three learn, the third
    # can end in the format-only collapse, depending on the draws (docs/tasks.md).
    c.optimizer.lr = 2e-5
    c.optimizer.decay_steps, c.optimizer.final_lr_fraction = 30, 0.1
    c.steps = 30
    c.eval_every = 30
    c.eval_pass_k = 1  # greedy only: 300 questions x k samples would double the evaluation's time per k
    c.checkpoint_every = 10
    c.run_dir = "runs/quickstart"
    return c
