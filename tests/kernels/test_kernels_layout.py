"""jaxgrpo/kernels is grouped by kind: each kernel lives in the module of its kind, modules stay short, and the old
module names (the kernels grouped by provenance) still import, re-exporting the kernels from their new homes."""

import importlib
import inspect
import pathlib

import pytest

from jaxgrpo import kernels
from jaxgrpo.kernels import registry

KERNELS_DIR = pathlib.Path(kernels.__file__).parent

#: Where the kernels of each kind live (a module, or a package's modules).
HOMES = {
    "advantage": "jaxgrpo.kernels.advantages.",
    "loss": "jaxgrpo.kernels.losses.",
    "token_advantage": "jaxgrpo.kernels.credit.",
    "credit": "jaxgrpo.kernels.credit.",
    "reward": "jaxgrpo.kernels.reward_shaping",
    "selection": "jaxgrpo.kernels.selection",
    "mask": "jaxgrpo.kernels.masks",
    "kl": "jaxgrpo.kernels.kl",
}

#: Names that code written against the old modules imports (each old module's kernels and helpers, a sample).
OLD_IMPORTS = {
    "catalog_advantages": ["gdpo", "xrpo", "rec", "opmd_loss", "mc_grpo_pivot_mask", "dgpo_question_weights",
                           "SEED_SCALINGS", "semantic_entropy_from_clusters", "joint_segment_ids", "_check_row_array"],
    "catalog_losses": ["sapo", "bapo_clip_bounds", "disco", "hapo", "hapo_clip", "degrpo", "policy_shaping"],
    "experimental": ["etr_clip", "dhpo", "SPOTrackerState", "spo_tracker_init", "spo_value_tracker", "spo_priority",
                     "spo_advantage", "a_grae", "t_ppo_egae", "grpo_vps_progress", "aepo_entropy",
                     "aepo_temperature_update", "grpo_lambda", "conciser_length_reward", "trapo_selection"],
    "group_rewards": ["pref_grpo_win_rate", "s_grpo_serial_rewards", "s_grpo_serial_advantages", "grpo_care_bonus",
                      "adaptthink_reward"],
    "reward_scaling": ["grpo_batch_std"],
    "sequence_losses": ["vespo", "gamma_weight", "MIN_LOG_SEQUENCE_RATIO"],
    "token_masks": ["off_policy_sequence_mask", "high_entropy_token_mask"],
    "shaping": ["overlong_penalty", "dynamic_sampling_filter"],
    "token": ["gae", "discounted_returns", "reinforce_pp_returns", "masked_whiten", "optimal_token_baseline"],
    "correction": ["importance_correction"],
}


def library_kernels():
    return [k for k in registry.list_kernels() if k.fn.__module__.split(".")[0] == "jaxgrpo"]


@pytest.mark.parametrize("kind", sorted(registry.KINDS))
def test_each_kernel_lives_in_the_module_of_its_kind(kind):
    misplaced = [(k.name, k.fn.__module__) for k in library_kernels() if k.kind == kind
                 and not (k.fn.__module__ + ".").startswith(HOMES[kind])]
    assert not misplaced, f"{kind} kernels outside {HOMES[kind]}: {misplaced}"


def test_modules_are_at_most_600_lines():
    long = {str(p.relative_to(KERNELS_DIR)): n for p in sorted(KERNELS_DIR.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these modules by what their kernels compute: {long}"


@pytest.mark.parametrize("old", sorted(OLD_IMPORTS))
def test_old_module_names_re_export_and_define_nothing(old):
    module = importlib.import_module(f"jaxgrpo.kernels.{old}")
    assert kernels.__getattr__(old) is module  # `jaxgrpo.kernels.<old>` resolves without an import of its own
    for name in OLD_IMPORTS[old]:
        assert name in module.__all__, f"jaxgrpo.kernels.{old} no longer has {name}"
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert value.__module__ != module.__name__, f"jaxgrpo.kernels.{old} defines {name}; it only re-exports"
    assert set(OLD_IMPORTS) == set(kernels._OLD_MODULES)


def test_packages_re_export_their_kernels():
    for kind, package in [("advantage", "advantages"), ("loss", "losses"), ("credit", "credit"),
                          ("token_advantage", "credit")]:
        module = importlib.import_module(f"jaxgrpo.kernels.{package}")
        for k in library_kernels():
            if k.kind == kind:
                assert getattr(module, k.fn.__name__) is k.fn, f"jaxgrpo.kernels.{package}.{k.fn.__name__}"
