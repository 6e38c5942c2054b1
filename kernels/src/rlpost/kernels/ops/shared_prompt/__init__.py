"""Shared-prompt attention (DualKV, catalog 000-21) and group packing.

The torch reference (``reference.py``) is the only implementation so far; the Triton
kernel is not written yet. Packing (:func:`pack_groups`) works with any model that takes
a 4D attention mask and position ids, e.g. Hugging Face decoders.
"""

from rlpost.kernels.ops.shared_prompt.reference import (
    PackedGroups,
    pack_group,
    pack_groups,
    packing_ratio,
    shared_prompt_attention,
)

__all__ = ["PackedGroups", "pack_group", "pack_groups", "packing_ratio", "shared_prompt_attention"]
