"""GRPO on GSM8K with Qwen3-14B, full-parameter, in bfloat16, on a v5p-16 (8 chips of 95 GiB, two hosts).

The step is every TPU recipe's (`jaxgrpo.config.recipes.gsm8k_grpo_tpu`): 16 prompts x 8 samples, 512 prompt + 1024 new
tokens, FSDP over every chip, rows unpacked.
`jaxgrpo-compile experiments/tpu/qwen3_14b_gsm8k_v5p_16.py --topology v5p:2x2x2` shows what it takes per chip
(docs/tpu.md); launch it with
`launch/tpu_pod.sh --experiment experiments/tpu/qwen3_14b_gsm8k_v5p_16.py --accelerator-type v5p-16 --name NAME --zone ZONE`.
The weights are read from `$JAXGRPO_MODELS/qwen3-14b` (see docs/models.md).
"""

from jaxgrpo.config import Config
from jaxgrpo.config.recipes import gsm8k_grpo_tpu

#: The slice this recipe is sized for, as `jaxgrpo-compile --topology` names it.
TOPOLOGY = "v5p:2x2x2"


def config() -> Config:
    return gsm8k_grpo_tpu("qwen3-14b", run_dir="runs/qwen3_14b_gsm8k_v5p_16")
