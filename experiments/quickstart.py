"""The main job: GRPO on SmolLM2-135M-Instruct (embedded GGUF) and procedural arithmetic, on CPU.

One-digit sums of three numbers ("What is 4 + 7 + 9?"): 1000 possible questions, half of them held out
(`test_share=2`), so the 300 evaluation examples hold 216 distinct questions that training never sees.
`jaxgrpo-train experiments/quickstart.py` evaluates them greedily before and after training (accuracy,
and the shares of well-formed and of well-formed-but-wrong answers) and prints where its curves and
checkpoints are. About 12 minutes on an idle 2-core CPU (11 min 46 s measured).
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
    c.sampling.max_new_tokens = 32  # answers take ~10 tokens; rambling past 32 scores 0
    c.optimizer.lr = 3e-5
    c.steps = 30
    c.eval_every = 30
    c.eval_pass_k = 1  # greedy only: 300 questions x k samples would double the evaluation's time per k
    c.checkpoint_every = 10
    c.run_dir = "runs/quickstart"
    return c
