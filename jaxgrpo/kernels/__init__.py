"""Pure, jit-compiled advantage and loss kernels, registered by name.

Importing this package registers every built-in kernel: the baselines
(advantages, losses, kl, token, aggregation, shaping, correction), the verified
catalog methods (catalog_advantages, catalog_losses, credit, group_rewards,
selection), the kernels that complete the peers' registries (reward_scaling,
sequence_losses, token_masks) and the documented reconstructions (experimental).
The tables that document and compare them (the kernel reference, the method catalog, the peers' registries
of verl, TRL and tunix, a short tour) are `jaxgrpo.catalog`'s, outside this package.
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
from jaxgrpo.kernels.correction import importance_correction
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
from jaxgrpo.kernels.shaping import dynamic_sampling_filter, overlong_penalty
from jaxgrpo.kernels.token import discounted_returns, gae, masked_whiten, optimal_token_baseline, reinforce_pp_returns

# The method catalog: importing registers the kernels.
from jaxgrpo.kernels import catalog_advantages, catalog_losses, credit, experimental, group_rewards, selection  # noqa: E402,F401
from jaxgrpo.kernels import reward_scaling, sequence_losses, token_masks  # noqa: E402,F401
