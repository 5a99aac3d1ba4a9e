"""`jaxgrpo.kernels.sequence_losses`, an old module name kept for code written against it: it only re-exports.

VESPO (`vespo`, `gamma_weight`) lives in `jaxgrpo.kernels.losses.sequence`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.losses.sequence import MIN_LOG_SEQUENCE_RATIO, _VESPO, gamma_weight, vespo

__all__ = [
    "MIN_LOG_SEQUENCE_RATIO",
    "_VESPO",
    "gamma_weight",
    "vespo",
]
