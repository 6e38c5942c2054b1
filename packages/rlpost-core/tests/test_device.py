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


def test_the_mmap_threshold_is_fixed_in_a_process_of_its_own():
    """``run.malloc_mmap_kb``: with the threshold fixed at 128 KiB a freed 16 MiB tensor
    leaves the process (resident memory falls back; glibc's own threshold rises to 16 MiB
    after the first is freed and keeps the next ones in the heap); ``None`` sets nothing
    (a large value is the next test's). glibc only:
    elsewhere the call reports False and the check is the return value alone."""
    import subprocess
    import sys

    code = """
import sys, torch
from rlpost.core._env import fix_mmap_threshold
from rlpost.core.io.schema import RunConfig
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])
assert fix_mmap_threshold(None) is False
assert RunConfig().malloc_mmap_kb is None
ok = fix_mmap_threshold(RunConfig(malloc_mmap_kb=128).malloc_mmap_kb)
before = rss()
for _ in range(3):
    x = torch.ones(4 * 2**20); del x
print(ok, rss() - before < 8 * 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    fixed, returned = out.stdout.split()
    if sys.platform == "linux" and fixed == "True":
        assert returned == "True"


def test_a_large_threshold_reuses_large_blocks_without_page_faults():
    """``run.malloc_mmap_kb=1048576`` (1 GiB): a 64 MiB tensor allocated, filled and
    freed again and again reuses the heap's pages once the heap holds its working set (a
    few rounds: glibc's free chunks grow by coalescing), so some of the last six
    allocations fault no page in; under glibc's own thresholds (at most 32 MiB) each
    allocation is a fresh mapping, faulted in page by page. glibc only."""
    import subprocess
    import sys

    code = """
import resource, sys, torch
from rlpost.core._env import fix_mmap_threshold
from rlpost.core.io.schema import RunConfig
if sys.argv[1] == "large":
    assert fix_mmap_threshold(RunConfig(malloc_mmap_kb=1048576).malloc_mmap_kb)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
each = []
for _ in range(12):
    before = faults()
    x = torch.ones(16 * 2**20); del x
    each.append(faults() - before)
print(min(each[6:]))
"""
    faults = {}
    for mode in ("large", "glibc"):
        out = subprocess.run(
            [sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        faults[mode] = int(out.stdout)
    if sys.platform == "linux":  # the fewest faults of one allocation, in the last six
        pages = 64 * 2**20 // 4096
        assert faults["glibc"] >= pages // 2, faults
        assert faults["large"] < pages // 100, faults
