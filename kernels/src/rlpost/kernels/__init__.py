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


def use_triton(backend: str, x: torch.Tensor, fits: bool = True) -> bool:
    """Whether an op with ``backend`` ``auto`` / ``triton`` / ``reference`` runs its Triton
    kernel on input ``x``: forced, or ``auto`` with ``x`` on CUDA, Triton installed and the
    op's own condition ``fits``; any other backend is a one-line error."""
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be auto, triton or reference, got {backend!r}")
    return backend == "triton" or (backend == "auto" and x.is_cuda and fits and triton_available())


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s ``input_precision`` for kernels whose inputs have ``dtype``. 16-bit
    inputs: ``"tf32"`` (their values are exact in TF32; the float32 partners, such as
    recomputed probabilities, keep ten mantissa bits, more than the inputs have). float32
    inputs: IEEE float32, as torch's own matmuls give, unless torch was told it may use
    TF32 (``torch.set_float32_matmul_precision("high")``): Triton's default would round
    a float32 model's logits to TF32 silently."""
    if dtype in (torch.float16, torch.bfloat16):
        return "tf32"
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"
