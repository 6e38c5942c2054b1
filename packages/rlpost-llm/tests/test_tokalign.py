"""Retokenisation and span alignment between two different tokenizers (rlpost.llm.model.tokalign):
the embedded character tokenizer and a BPE tokenizer trained with ``tokenizers``."""

from __future__ import annotations

import random

import pytest
import torch

from rlpost.llm.data.tasks import make_task
from rlpost.llm.model.tokalign import align, block_sums, retokenize, tokenize


def _texts(n: int = 60) -> list[str]:
    rng = random.Random(0)
    out = []
    for name in ("arithmetic", "countdown"):
        for e in make_task(name).sample(n, rng):
            out.append(f"{e.prompt}{e.answer}")
    return out


@pytest.fixture(scope="module")
def char_tok():
    from rlpost.llm.model import tiny

    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def bpe_tok():
    """A byte-level BPE tokenizer trained on task text (merges across digits and ops)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_texts(400) * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_retokenize_round_trips_text_on_both_tokenizers(char_tok, bpe_tok):
    for text in _texts():
        for tok in (char_tok, bpe_tok):
            ids = retokenize(text, tok)
            assert tok.decode(ids, clean_up_tokenization_spaces=False) == text
    ratio = sum(len(retokenize(t, bpe_tok)) for t in _texts()) / sum(map(len, _texts()))
    assert ratio < 0.8  # BPE merges characters


def test_alignment_blocks_partition_the_text_and_match_exactly(char_tok, bpe_tok):
    merged = 0
    for text in _texts():
        a, b = tokenize(char_tok, text), tokenize(bpe_tok, text)
        al = align(a, b)
        assert al.chars[0][0] == 0 and al.chars[-1][1] == len(text)
        assert all(x[1] == y[0] for x, y in zip(al.chars, al.chars[1:], strict=False))
        for (s, e), (a0, a1), (b0, b1) in zip(al.chars, al.a, al.b, strict=True):
            assert a1 > a0 and b1 > b0  # every block has tokens on both sides
            assert char_tok.decode(a.ids[a0:a1]) == text[s:e]
            assert bpe_tok.decode(b.ids[b0:b1], clean_up_tokenization_spaces=False) == text[s:e]
        assert [al.a_block[i] for i in range(len(a.ids))] == sorted(al.a_block)
        merged += sum(a1 - a0 > 1 for a0, a1 in al.a)
    assert merged > 0  # BPE tokens span several characters somewhere


def test_the_same_tokenizer_aligns_token_for_token(bpe_tok):
    text = _texts()[3]
    t = tokenize(bpe_tok, text)
    al = align(t, t)
    assert al.a == al.b == [(i, i + 1) for i in range(len(t.ids))]


def test_block_sums_add_each_blocks_token_values():
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert block_sums(v, [(0, 2), (2, 3), (3, 5)]).tolist() == [3.0, 3.0, 9.0]


def test_different_texts_are_refused(char_tok):
    with pytest.raises(ValueError, match="different texts"):
        align(tokenize(char_tok, "12+3="), tokenize(char_tok, "12+4="))
