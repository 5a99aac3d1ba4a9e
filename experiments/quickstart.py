"""The main job: GRPO on SmolLM2-135M-Instruct (embedded GGUF) and the procedural arithmetic task, on CPU.

`jaxgrpo-train experiments/quickstart.py` evaluates the held-out split before and after training and
prints where its curves and checkpoints are. Sized to finish in about 15 minutes on a 2-core CPU.
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.model = "smollm2-135m-instruct"
    c.task.name = "arithmetic"  # one-digit addition, "Finish your reply with 'The answer is N.'"
    c.task.num_eval_examples = 32  # the 11 one-digit test questions, cycled; 4 samples each for pass@1
    c.advantage = "grpo"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.prompts_per_step, c.group_size = 8, 4
    c.micro_batch_size = 8  # exact gradient accumulation; bounds activation memory to a few GB
    c.sampling.temperature = 0.8
    c.sampling.max_new_tokens = 32  # answers take ~15 tokens; rambling past 32 scores 0
    c.optimizer.lr = 2e-5
    c.steps = 20
    c.eval_every = 20
    c.eval_pass_k = 4
    c.checkpoint_every = 10
    c.run_dir = "runs/quickstart"
    return c
