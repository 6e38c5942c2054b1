import pytest
import torch


@pytest.fixture
def one_thread():
    """Train the small test models on one thread (two cores are shared in CI)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
