"""Which responses the teacher's signal applies to.

OPSD (catalog 001-16) distils correct and incorrect rollouts separately, to tell
compression (training on correct rollouts only) from correction (incorrect only):
``all``, ``correct`` or ``incorrect``, by the verifier's outcome of each response.
"""

from __future__ import annotations

import torch
from torch import Tensor

ROW_FILTERS = ("all", "correct", "incorrect")


def distill_rows(correct: Tensor, which: str) -> Tensor:
    """``[B]`` float: 1 for the responses distilled under filter ``which``, given each
    response's verifier outcome ``correct`` ``[B]`` (bool, or accuracy in [0, 1], correct
    when >= 0.5)."""
    if which not in ROW_FILTERS:
        raise ValueError(f"distill rows {which!r}: one of {', '.join(ROW_FILTERS)}")
    ok = correct >= 0.5 if correct.dtype.is_floating_point else correct.bool()
    if which == "all":
        return torch.ones(correct.shape, dtype=torch.float32)
    return (ok if which == "correct" else ~ok).float()
