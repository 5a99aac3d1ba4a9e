"""GRPO on GSM8K with Qwen3-8B and LoRA, in bfloat16, on a v5e-8 (8 chips of 16 GiB, one host).

The step is every TPU recipe's (`jaxgrpo.config.recipes.gsm8k_grpo_tpu`, the Qwen3-1.7B v5e-8 recipe's shapes): 16 prompts
x 8 samples, 512 prompt + 1024 new tokens, FSDP over every chip, rows unpacked. Rank-16 adapters on every projection
train (44M parameters, their Adam moments in float32); the 8B base stays in bfloat16, read-only, and is the KL
reference with the adapters off. The learning rate is 10x the full fine-tune's (LoRA's, "LoRA Without Regret",
Thinking Machines 2025). `--set lora.quantize_base=nf4` makes it QLoRA (the base in 4-bit NormalFloat).
`jaxgrpo-compile experiments/tpu/qwen3_8b_lora_gsm8k_v5e_8.py --topology v5e:2x4` shows what it takes per chip:
docs/tpu.md gives it with LoRA, with QLoRA nf4 and as a full fine-tune (`--set lora=none`) of the same model on the
same slice (update 5.30, 4.18 and 13.25 of 16 GiB per chip; the full fine-tune also keeps a 1.91 GiB reference
copy a chip); launch it with
`launch/tpu_pod.sh --experiment experiments/tpu/qwen3_8b_lora_gsm8k_v5e_8.py --accelerator-type v5litepod-8 --name NAME --zone ZONE`.
The weights are read from `$JAXGRPO_MODELS/qwen3-8b` (see docs/models.md).
"""

from jaxgrpo.config import Config, LoraConfig
from jaxgrpo.config.recipes import gsm8k_grpo_tpu

#: The slice this recipe is sized for, as `jaxgrpo-compile --topology` names it.
TOPOLOGY = "v5e:2x4"


def config() -> Config:
    c = gsm8k_grpo_tpu("qwen3-8b", run_dir="runs/qwen3_8b_lora_gsm8k_v5e_8")
    c.lora = LoraConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    c.optimizer.lr = 10 * c.optimizer.lr
    return c
