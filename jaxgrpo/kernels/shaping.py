"""`jaxgrpo.kernels.shaping`, an old module name kept for code written against it: it only re-exports.

DAPO's overlong penalty lives in `jaxgrpo.kernels.reward_shaping`, its dynamic-sampling filter in
`jaxgrpo.kernels.selection`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.reward_shaping import overlong_penalty
from jaxgrpo.kernels.selection import dynamic_sampling_filter

__all__ = [
    "dynamic_sampling_filter",
    "overlong_penalty",
]
