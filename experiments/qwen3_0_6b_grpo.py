"""GRPO (DeepSeekMath, 2024) on GSM8K with Qwen3-0.6B in bfloat16, shaped for a TPU slice.

The TPU recipes' step (`jaxgrpo.config.recipes.gsm8k_grpo_tpu`: 16 prompts x 8 samples = 128 sequences a step, two
optimizer updates of 64, each accumulated over micro-batches of 16 sequences, parameters and optimizer state
sharded over every chip) with 512 new tokens and packed rows. The weights are read from
`$JAXGRPO_MODELS/qwen3-0.6b` (download `Qwen/Qwen3-0.6B` there; see `jaxgrpo.models.architectures`);
`jaxgrpo-compile experiments/qwen3_0_6b_grpo.py --topology v5e:2x4` needs none.
"""

from jaxgrpo.config import Config
from jaxgrpo.config.recipes import gsm8k_grpo_tpu


def config() -> Config:
    c = gsm8k_grpo_tpu("qwen3-0.6b", run_dir="runs/qwen3_0_6b_grpo")
    c.sampling.max_new_tokens = 512
    c.packing = True  # each prompt scored once per group
    return c
