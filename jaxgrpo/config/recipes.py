"""Configs that several experiment files build on, kept here because an experiment file may travel alone.

`launch/tpu_pod.sh` copies the experiment file by itself to every worker, where jaxgrpo is installed:
a recipe can import from the package but not load a file beside it.
"""

from jaxgrpo.config import Config


def gsm8k_grpo_tpu(model: str, run_dir: str) -> Config:
    """GRPO (DeepSeekMath, 2024) on GSM8K, full-parameter, in bfloat16, shaped for a TPU slice.

    16 prompts x 8 samples a step, 512 prompt + 1024 new tokens, two optimizer updates of 64 sequences
    each accumulated over micro-batches of 16 (two whole groups; the rows of each divide over 8 or 16
    chips), parameters and optimizer state sharded over every chip (FSDP), activations rematerialized per
    layer, rows unpacked. The recipes of experiments/tpu/ differ only in `model` (and so `run_dir`).
    """
    c = Config()
    c.model = model
    c.dtype = "bfloat16"
    c.remat = True
    # Unpacked rows: packing a group (512 + 8 x 1024 = 8704 tokens a row) makes each layer's dense attention
    # scores [rows, heads, 8704, 8704] float32, 9 GiB each for Qwen3-0.6B (docs/tpu.md).
    c.packing = False
    c.task.name = "gsm8k"
    c.advantage = "grpo"  # (r - mean_g) / (std_g + eps)
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2}
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef, c.kl_kind = 0.04, "k3"  # the paper's beta
    c.prompts_per_step, c.group_size = 16, 8
    c.num_minibatches = 2
    c.micro_batch_size = 16
    c.sampling.max_prompt_len = 512
    c.sampling.max_new_tokens = 1024
    c.sampling.temperature = 1.0
    # The rollout engine samples: one per host, its decode reading the paged pool in place with the Pallas kernel,
    # estimated at 0.99-1.02x its step's HBM floor with the pool full, every program fitting (docs/tpu.md, the
    # *_engine reports; no TPU run measured yet). The fixed batch, the recipes' sampler until 2026-12-06, was
    # estimated at 1.01-1.04x.
    c.mesh.data, c.mesh.fsdp, c.mesh.model = 1, -1, 1
    c.optimizer.lr = 1e-6
    c.steps = 500
    c.eval_every = 50
    c.checkpoint_every = 50
    c.run_dir = run_dir
    return c
