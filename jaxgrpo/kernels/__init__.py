"""Pure, jit-compiled kernels, registered by name, grouped by kind: one module or small package per kind.

Importing this package registers every built-in kernel. A kernel lives in the module of its kind (the
registry's `KINDS`) and, inside a package, in the module named for what it computes:

    advantages/        kind "advantage": outcome advantage estimators, rewards f32[N] -> advantages f32[N]
      group_normalized   against a group's center, scaled by a spread (GRPO, Dr. GRPO, NGRPO, HAPO, BNPO, ...)
      baselines          a baseline subtracted, no group std (RLOO, OPO, GPG, pass@k, ReMax, OPMD, KRPO, ...)
      whitened           whitened over the batch (REINFORCE++, single-stream SPO)
      structured         a structure inside or across the groups (GDPO, GiGPO, Stratified GRPO, SEED-GRPO, RiskPO)
      reshaped           another estimator's advantage reshaped (XRPO, A-GRAE)
    losses/            kind "loss": policy losses (logp, old_logp, advantages, mask) -> per-token loss
      clipped            PPO's clipped token ratio and losses built on it (GRPO, DAPO, SAPO, DeGRPO, Clip-Cov, ...)
      adaptive_clip      a clip range computed from the batch (BAPO, HAPO, ETR)
      sequence           sequence-level ratios and scores (GSPO, GMPO, VESPO, DHPO, DisCO)
      reinforce          -w A log pi with a constant weight (REINFORCE, CISPO, DPPO, DRO, REC, OPMD, ...)
    credit/            kinds "token_advantage" and "credit": per-token advantages, returns and weights
      returns            token-level returns and advantages (discounted returns, GAE, OTB, T-PPO's EGAE)
      assignment         credit from token, step, rank or segment signals (TW-GRPO, PURE, Rank-GRPO, GRPO-VPS)
      importance         sampler/trainer mismatch weights (TIS, MIS)
    reward_shaping     kind "reward": raw outcomes in, shaped rewards out
    selection          kind "selection": prompt and group selection, rollout allocation, prompt sampling
    masks              kind "mask": loss masks from rewards, groups or the policy's statistics
    kl                 kind "kl": KL estimators between two per-token log-probabilities
    aggregation        per-token losses to a scalar, exactly across micro-batches
    entropy            token entropy from logits
  and the helpers every kind uses: `segments` (group statistics), `validation` (input checks),
  `hyperparameters` (declared ranges), `registry`. A package's `common` module holds what its modules share.

To add an estimator, a loss or any kernel, put it in the module of its kind that computes the same kind of
thing (or a new module of that package) and register it there. Provenance is not a module: it is part of
each registration (`paper=`, `experimental=`). The documented reconstructions of methods whose formula could
not be checked against the authors' code are registered under `experimental/` names, in the module of their
kind; each docstring says what is reconstructed, and every hyper-parameter that switches the reconstruction
off is tested to reduce to a verified kernel (e.g. DHPO with token weight 1 is `ppo_clip`).

The old module names, which grouped the kernels by where they came from (`catalog_advantages`,
`catalog_losses`, `experimental`, `group_rewards`, `reward_scaling`, `sequence_losses`, `token_masks`,
`shaping`, `token`, `correction`), re-export their kernels from the new homes, for code written against them.

The tables that document and compare the kernels (the kernel reference, the method catalog, the peers'
registries of verl, TRL and tunix, a short tour) are `jaxgrpo.catalog`'s, outside this package.
"""

from jaxgrpo.kernels import segments
from jaxgrpo.kernels.advantages import dr_grpo, gpg, grpo, opo, pass_at_k, reinforce_pp, reinforce_pp_baseline, remax, rloo
from jaxgrpo.kernels.aggregation import (
    AGGREGATION_MODES,
    LossParts,
    aggregate,
    aggregation_denominator,
    aggregation_parts,
)
from jaxgrpo.kernels.credit import (
    discounted_returns,
    gae,
    importance_correction,
    masked_whiten,
    optimal_token_baseline,
    reinforce_pp_returns,
)
from jaxgrpo.kernels.entropy import entropy_from_logits
from jaxgrpo.kernels.kl import KL_KINDS, kl_penalty
from jaxgrpo.kernels.losses import (
    cispo,
    clip_cov,
    clipped_value_loss,
    dppo_kl,
    dppo_tv,
    dro,
    gmpo,
    gspo,
    gspo_token,
    kl_cov,
    ppo_clip,
    reinforce,
)
from jaxgrpo.kernels.registry import (
    KINDS,
    KernelInfo,
    get,
    get_advantage,
    get_loss,
    info,
    list_kernels,
    register,
    register_advantage,
    register_loss,
)
from jaxgrpo.kernels.reward_shaping import overlong_penalty
from jaxgrpo.kernels.selection import dynamic_sampling_filter

# The kind without a name imported above: importing registers its kernels.
from jaxgrpo.kernels import masks  # noqa: E402,F401

#: The old module names (the kernels grouped by provenance), kept for code written against them: each
#: re-exports its kernels from their new homes, and is imported on first use (`jaxgrpo.kernels.experimental`).
_OLD_MODULES = ("catalog_advantages", "catalog_losses", "correction", "experimental", "group_rewards",
                "reward_scaling", "sequence_losses", "shaping", "token", "token_masks")


def __getattr__(name: str):
    if name in _OLD_MODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
