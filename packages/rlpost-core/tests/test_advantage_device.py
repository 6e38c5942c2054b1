"""Every advantage estimator allocates on its inputs' device, never on the default one.

A CPU-only machine cannot run CUDA inputs, so the test turns it around: the inputs stay
on the CPU while the *default* device is ``meta``. Any tensor an estimator creates
without ``device=`` (``torch.zeros(G)``, ``torch.arange(B)``, ``torch.tensor(x)``) then
lands on ``meta`` and the first op mixing it with an input raises, or silently gives
numbers that differ from the reference computed with the default device on the CPU.
"""

import pytest
import torch

from rlpost.core import ADVANTAGES, AdvantageInput, Input, TrainingDynamics
from rlpost.core.advantages.best_of_n import _h_table

B, T = 8, 5


def _input(name: str) -> AdvantageInput:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2, 4, 3])
    mask = (torch.arange(T) < lengths[:, None]).float()
    rewards = torch.tensor([1.0, 0.0, 0.3, 1.0, 0.7, 1.0, 0.2, 0.9])
    if Input.VECTOR_REWARDS in ADVANTAGES.build(name).needs:
        rewards = torch.stack([rewards, torch.rand(B, generator=g)], 1)
    return AdvantageInput(
        rewards,
        torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        mask,
        values=torch.randn(B, T, generator=g),
        logprobs=-torch.rand(B, T, generator=g) * mask,
        turn_ids=torch.where(mask > 0, torch.arange(T) // 2, -1),
        teacher_logprobs=-torch.rand(B, T, generator=g) * mask,
        prompt_features=torch.randn(B, 4, generator=g),
        completion_features=torch.randn(B, 4, generator=g),
        turn_rewards=torch.randn(B, 3, generator=g),
        dynamics=TrainingDynamics(progress=0.5, entropy=0.8, initial_entropy=1.0),
    )


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_advantage_allocates_on_input_device(name: str) -> None:
    fn = ADVANTAGES.build(name)
    ref = fn(_input(name))
    inp = _input(name)
    _h_table.cache_clear()  # TEA's cached table must be rebuilt under the meta default
    with torch.device("meta"):
        out = fn(inp)
    assert out.advantages.device.type == "cpu"
    torch.testing.assert_close(out.advantages, ref.advantages)
