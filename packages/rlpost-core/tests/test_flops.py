"""FLOP accounting (004-01, RACE): 2 N per token forward, (4 N + 2 N_trainable) forward
and backward, counted from the tokens that actually enter a model."""

import pytest
import torch
from torch import nn

from rlpost.core.flops import FlopCounter, flop_params, forward_flops, training_flops


class TinyLM(nn.Module):
    """Embedding, two matmuls, an output head (tied or not)."""

    def __init__(self, vocab=11, d=6, tied=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        return self.head(self.mlp(self.embed(ids)))


def test_the_counted_parameters_are_the_matmuls_ones():
    d, v = 6, 11
    mlp = (d * 2 * d + 2 * d) + (2 * d * d + d)
    assert flop_params(TinyLM(tied=True)) == (mlp + v * d, mlp + v * d)  # the table as head
    assert flop_params(TinyLM(tied=False)) == (mlp + v * d, mlp + v * d)  # the lookup left out
    frozen = TinyLM(tied=False)
    frozen.mlp.requires_grad_(False)
    assert flop_params(frozen) == (mlp + v * d, v * d)


def test_analytic_counts():
    assert forward_flops(1000, 7) == 14_000
    assert training_flops(1000, 1000, 7) == 6 * 1000 * 7  # full fine-tuning: 6 N T
    assert training_flops(1000, 10, 7) == (4000 + 20) * 7  # LoRA-like: about 4 N T


@pytest.mark.parametrize("tied", [True, False])
def test_the_counter_sees_every_token_and_whether_it_trains(tied):
    m = TinyLM(tied=tied)
    n, _ = flop_params(m)
    c = FlopCounter(m)
    with torch.no_grad():
        m(torch.zeros(3, 5, dtype=torch.long))  # 15 tokens, inference
        m(torch.zeros(3, 1, dtype=torch.long))  # a decode step: 3 more
    m(torch.zeros(2, 4, dtype=torch.long)).sum().backward()  # 8 tokens, trained
    assert c.counts == {"inference": 2 * n * 18, "train": 6 * n * 8}
    assert c.take()["train"] == 6 * n * 8 and c.counts == {}
    c.close()
    m(torch.zeros(1, 1, dtype=torch.long))
    assert c.counts == {}  # the hook is gone


def test_a_copy_of_a_counted_model_is_not_counted_twice_and_pickles():
    """An engine's or a reference's deep copy carries no counter (nor its lock)."""
    import copy
    import pickle

    m = TinyLM()
    c = FlopCounter(m)
    twin = copy.deepcopy(m)
    with torch.no_grad():
        twin(torch.zeros(2, 3, dtype=torch.long))
    assert c.counts == {}
    pickle.loads(pickle.dumps(m))(torch.zeros(1, 1, dtype=torch.long))
    assert c.counts == {}
    m(torch.zeros(1, 1, dtype=torch.long))
    assert c.counts["train"] == 6 * flop_params(m)[0]  # the original still counts itself
