"""rlpost.kernels: ops with readable torch references and Triton kernels (CUDA only).

Triton is imported lazily and only on CUDA; every op has a pure-torch reference that
runs anywhere.
"""

import importlib.util

import torch

__version__ = "0.1.0"


def triton_available() -> bool:
    """True when Triton kernels can run: CUDA present and the ``triton`` module importable."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
