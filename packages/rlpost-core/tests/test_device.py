"""rlpost.core.pick_device: the run's device setting, resolved or refused in one line."""

import pytest
import torch

from rlpost.core import pick_device


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun: each rank its own GPU
    assert pick_device("auto") == torch.device("cuda:1")
    monkeypatch.delenv("LOCAL_RANK")
    assert pick_device("auto") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="only 2 CUDA device"):
        pick_device("cuda:2")


def test_named_devices_and_bad_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        pick_device("cuda")
    with pytest.raises(ValueError, match="device 'gpu'"):
        pick_device("gpu")
