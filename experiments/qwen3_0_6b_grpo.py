"""GRPO (DeepSeekMath, 2024) on GSM8K with Qwen3-0.6B in bfloat16, shaped for a TPU slice.

The weights are read from `$JAXGRPO_MODELS/qwen3-0.6b` (download `Qwen/Qwen3-0.6B` there; see
`jaxgrpo.models.architectures`); `jaxgrpo-compile experiments/qwen3_0_6b_grpo.py --topology v5e:2x4` needs
none. Parameters and optimizer state are sharded over every chip (FSDP).
"""

from jaxgrpo.config import Config


def config() -> Config:
    c = Config()
    c.model = "qwen3-0.6b"
    c.dtype = "bfloat16"
    c.task.name = "gsm8k"
    c.advantage = "grpo"  # (r - mean_g) / (std_g + eps)
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2}
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef, c.kl_kind = 0.04, "k3"  # the paper's beta
    # 16 prompts x 8 samples = 128 sequences a step, two optimizer updates of 64, each accumulated over
    # micro-batches of 16 sequences (two whole groups, as packing needs; 2 a chip on 8 chips).
    c.prompts_per_step, c.group_size = 16, 8
    c.num_minibatches = 2
    c.micro_batch_size = 16
    c.sampling.max_prompt_len = 512
    c.sampling.max_new_tokens = 512
    c.sampling.temperature = 1.0
    c.mesh.data, c.mesh.fsdp, c.mesh.model = 1, -1, 1
    c.optimizer.lr = 1e-6
    c.steps = 500
    c.eval_every = 50
    c.checkpoint_every = 50
    c.run_dir = "runs/qwen3_0_6b_grpo"
    return c
