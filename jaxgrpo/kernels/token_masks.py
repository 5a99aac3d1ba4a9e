"""`jaxgrpo.kernels.token_masks`, an old module name kept for code written against it: it only re-exports.

`off_policy_sequence_mask` and `high_entropy_token_mask` live in `jaxgrpo.kernels.masks`.

`jaxgrpo.kernels`' docstring describes the layout by kind; import from the modules named above.
"""

from __future__ import annotations

from jaxgrpo.kernels.masks import high_entropy_token_mask, off_policy_sequence_mask

__all__ = [
    "high_entropy_token_mask",
    "off_policy_sequence_mask",
]
