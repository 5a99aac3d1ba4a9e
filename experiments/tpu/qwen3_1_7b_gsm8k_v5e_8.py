"""GRPO on GSM8K with Qwen3-1.7B, full-parameter, in bfloat16, on a v5e-8 (8 chips of 16 GiB, one host).

The step is every TPU recipe's (`jaxgrpo.config.recipes.gsm8k_grpo_tpu`): 16 prompts x 8 samples, 512 prompt + 1024 new
tokens, FSDP over every chip, rows unpacked.
`jaxgrpo-compile experiments/tpu/qwen3_1_7b_gsm8k_v5e_8.py --topology v5e:2x4` shows what it takes per chip
(docs/tpu.md); launch it with
`launch/tpu_pod.sh --experiment experiments/tpu/qwen3_1_7b_gsm8k_v5e_8.py --accelerator-type v5litepod-8 --name NAME --zone ZONE`.
The weights are read from `$JAXGRPO_MODELS/qwen3-1.7b` (see docs/models.md).
"""

from jaxgrpo.config import Config
from jaxgrpo.config.recipes import gsm8k_grpo_tpu

#: The slice this recipe is sized for, as `jaxgrpo-compile --topology` names it.
TOPOLOGY = "v5e:2x4"


def config() -> Config:
    return gsm8k_grpo_tpu("qwen3-1.7b", run_dir="runs/qwen3_1_7b_gsm8k_v5e_8")
