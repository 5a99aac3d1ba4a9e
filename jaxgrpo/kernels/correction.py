"""`jaxgrpo.kernels.correction`, an old module name kept for code written against it: it only re-exports.

`importance_correction` (TIS/MIS) lives in `jaxgrpo.kernels.credit.importance` (re-exported by
`jaxgrpo.kernels.credit`).

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.credit.importance import _PAPER, importance_correction

__all__ = [
    "_PAPER",
    "importance_correction",
]
