"""Experiment configuration: nested dataclasses, command-line overrides, experiment files.

An experiment is a small Python file with a `config()` function returning a
`Config`::

    from jaxgrpo.config import Config

    def config() -> Config:
        c = Config()
        c.advantage = "dr_grpo"
        c.aggregation = "seq_mean_token_sum_norm"
        return c

Any field can be overridden on the command line with dotted keys, e.g.
``--set optimizer.lr=1e-6 group_size=8 loss_kwargs.eps_high=0.28``. An unknown
key is an error that lists the valid ones, and so is assigning a field that does
not exist (``c.group_sise = 4``). `validate` checks every value before anything
heavy is built.

The package: `fields` (`Config` and its sections), `overrides` (`--set` and experiment files) and `validation`
(`validate`); everything is importable from `jaxgrpo.config` itself. `recipes` holds configs several experiment
files build on (`jaxgrpo.config.recipes.gsm8k_grpo_tpu`).
"""

from jaxgrpo.config.fields import (
    ATTENTION_NAMES,
    DTYPES,
    LORA_TARGETS,
    PACKING_BY_PLATFORM,
    REMAT_POLICIES,
    REPLACED,
    STATE_DTYPES,
    Config,
    EnvironmentConfig,
    GuidanceConfig,
    LoraConfig,
    MeshConfig,
    OptimizerConfig,
    SamplingConfig,
    TaskConfig,
    migrate,
    replaced,
    resolve_packing,
    to_dict,
)
from jaxgrpo.config.overrides import (
    ExperimentError,
    apply_override,
    apply_overrides,
    load_experiment,
    optional_section,
    valid_keys,
)
from jaxgrpo.config.validation import validate
from jaxgrpo.errors import ConfigError

__all__ = [
    "ATTENTION_NAMES", "DTYPES", "LORA_TARGETS", "PACKING_BY_PLATFORM", "REMAT_POLICIES", "REPLACED", "STATE_DTYPES",
    "Config", "ConfigError", "EnvironmentConfig", "ExperimentError", "GuidanceConfig", "LoraConfig", "MeshConfig",
    "OptimizerConfig", "SamplingConfig", "TaskConfig", "apply_override", "apply_overrides", "load_experiment",
    "migrate", "optional_section", "replaced", "resolve_packing", "to_dict", "valid_keys", "validate",
]
