"""A toy GRPO run that learns in a couple of CPU minutes: a tiny random decoder, character tokens,
'a+b=' -> the last digit of a+b, after a short supervised warm-up. Used by the tests and notebooks."""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.model = "toy-tiny"
    c.task.name = "toy_sum"
    c.task.kwargs = {"max_operand": 2}  # a, b in {0, 1, 2}: learnable in a minute
    c.task.num_eval_examples = 64
    c.correctness_reward = "first_char_reward"
    c.advantage = "grpo"
    c.loss = "ppo_clip"
    c.aggregation = "seq_mean_token_mean"
    c.prompts_per_step, c.group_size = 8, 8
    c.sampling.max_new_tokens = 2
    c.sampling.temperature = 1.0
    c.optimizer.lr = 1e-3
    c.warmup_sft_steps, c.warmup_sft_lr = 20, 3e-3  # partial competence, so groups disagree
    c.steps = 60
    c.eval_every = 20
    c.checkpoint_every = 20
    c.run_dir = "runs/toy_sum"
    return c
