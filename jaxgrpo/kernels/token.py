"""`jaxgrpo.kernels.token`, an old module name kept for code written against it: it only re-exports.

GAE, discounted returns, REINFORCE++ returns, `masked_whiten` and the optimal token baseline live in
`jaxgrpo.kernels.credit.returns` (re-exported by `jaxgrpo.kernels.credit`).

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.credit.returns import (
    GAMMA,
    LAMBDA,
    _reverse_scan,
    discounted_returns,
    gae,
    masked_whiten,
    optimal_token_baseline,
    reinforce_pp_returns,
)

__all__ = [
    "GAMMA",
    "LAMBDA",
    "_reverse_scan",
    "discounted_returns",
    "gae",
    "masked_whiten",
    "optimal_token_baseline",
    "reinforce_pp_returns",
]
