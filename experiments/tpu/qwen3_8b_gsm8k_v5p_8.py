"""GRPO on GSM8K with Qwen3-8B, full-parameter, in bfloat16, on a v5p-8 (4 chips of 95 GiB, one host).

16 prompts x 8 samples a step, 512 prompt + 1024 new tokens, two optimizer updates of 64 sequences each
accumulated over micro-batches of 16, parameters and optimizer state sharded over every chip (FSDP),
activations rematerialized per layer, rows unpacked. `jaxgrpo-compile experiments/tpu/qwen3_8b_gsm8k_v5p_8.py --topology v5p:2x2x1`
shows what it takes per chip (docs/tpu.md); launch it with
`launch/tpu_pod.sh --experiment experiments/tpu/qwen3_8b_gsm8k_v5p_8.py --accelerator-type v5p-8 --name NAME --zone ZONE`.
The weights are read from `$JAXGRPO_MODELS/qwen3-8b` (see docs/models.md).
"""

from jaxgrpo.config import Config

#: The slice this recipe is sized for, as `jaxgrpo-compile --topology` names it.
TOPOLOGY = "v5p:2x2x1"


def config() -> Config:
    c = Config()
    c.model = "qwen3-8b"
    c.dtype = "bfloat16"
    c.remat = True
    # Unpacked rows: packing a group (512 + 8 x 1024 = 8704 tokens a row) makes each layer's dense attention
    # scores [rows, heads, 8704, 8704] float32, 9 GiB each for Qwen3-0.6B (docs/tpu.md).
    c.packing = False
    c.task.name = "gsm8k"
    c.advantage = "grpo"
    c.loss = "ppo_clip"
    c.loss_kwargs = {"eps_low": 0.2}
    c.aggregation = "seq_mean_token_mean"
    c.kl_coef, c.kl_kind = 0.04, "k3"
    c.prompts_per_step, c.group_size = 16, 8
    c.num_minibatches = 2
    c.micro_batch_size = 16
    c.sampling.max_prompt_len = 512
    c.sampling.max_new_tokens = 1024
    c.sampling.temperature = 1.0
    c.mesh.data, c.mesh.fsdp, c.mesh.model = 1, -1, 1
    c.optimizer.lr = 1e-6
    c.steps = 500
    c.eval_every = 50
    c.checkpoint_every = 50
    c.run_dir = "runs/qwen3_8b_gsm8k_v5p_8"
    return c
