"""jaxgrpo: GRPO-family reinforcement learning of language models in JAX.

The heart of the library is `jaxgrpo.kernels`: pure advantage and loss
functions, registered by name. The most used ones are re-exported here::

    import jaxgrpo
    adv = jaxgrpo.get_advantage("grpo")(rewards, group_ids, num_groups=8)
    per_token, metrics = jaxgrpo.get_loss("ppo_clip")(logp, old_logp, adv, mask)
    loss, parts = jaxgrpo.aggregate(per_token, mask, "token_mean")
"""

from jaxgrpo.kernels import (
    AGGREGATION_MODES,
    KL_KINDS,
    LossParts,
    aggregate,
    aggregation_denominator,
    aggregation_parts,
    gae,
    get,
    get_advantage,
    get_loss,
    kl_penalty,
    list_kernels,
    register,
    register_advantage,
    register_loss,
)

__version__ = "0.1.0"
