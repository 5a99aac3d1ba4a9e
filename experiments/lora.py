"""The main job with LoRA: experiments/quickstart.py's GRPO run, training rank-16 adapters on every projection
instead of every weight.

The config is quickstart.py's own (read from it, so a change there carries over), with `c.lora` set and a learning
rate 10x the full fine-tune's: LoRA's best learning rate sits about 10x above full fine-tuning's across model sizes
("LoRA Without Regret", Schulman et al., Thinking Machines 2025). Only the adapters (4.9M parameters for
SmolLM2-135M) and their Adam moments train and go into checkpoints (float32: 59 MB a checkpoint, against 1.6 GB
for the full run's 135M parameters and moments); the KL reference, if a KL term is added, is the base with the
adapters off. `--set lora.quantize_base=nf4` makes it QLoRA. docs/lora.md says what is trained, kept and exported.
"""

import os

from jaxgrpo.config import Config, LoraConfig, load_experiment

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def config() -> Config:
    c = load_experiment(QUICKSTART)
    c.lora = LoraConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    c.optimizer.lr = 10 * c.optimizer.lr
    c.run_dir = "runs/lora"
    return c
