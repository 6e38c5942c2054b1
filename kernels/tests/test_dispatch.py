import subprocess
import sys

import torch

import rlpost.kernels as kernels


def test_triton_is_not_used_without_cuda():
    # Triton kernels run only on CUDA; elsewhere every op uses its torch reference.
    if not torch.cuda.is_available():
        assert kernels.triton_available() is False


def test_importing_kernels_does_not_import_triton():
    # PyPI's Linux torch wheel installs triton; rlpost.kernels must still load it lazily.
    code = "import sys, rlpost.kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
