"""Tokenizer heterogeneity: retokenise text and align two tokenizations by text spans.

Two models with different tokenizers see the same completion as different token
sequences. Both cut the same characters, so the character offsets where *both* put a
token boundary split the text into blocks that each tokenization covers exactly: block
``k`` is the characters ``[c_{k-1}, c_k)`` and the tokens of each side that end inside it.
A block's log-probability under a model is the sum of its tokens' log-probs (the same
text span given the same text before it), so two models' block log-probs compare
directly: cross-tokenizer on-policy distillation scores the student's blocks against the
teacher's, and Mutual RL moves token-level traces between policies through the same
blocks.

Offsets come from the fast tokenizers' ``offset_mapping``; a tokenizer that puts a
token's offsets inside another token (byte-level pieces of one character) only loses
those inner boundaries, never a block's exactness. Texts with special tokens are not
aligned (``add_special_tokens=False`` throughout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tokenized:
    """``ids`` of ``text`` and each token's character span ``(start, end)``."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]


def tokenize(tokenizer, text: str) -> Tokenized:
    """``text`` tokenised without special tokens, with character offsets."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return Tokenized(text, list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]])


def tokenize_exact(tokenizer, text: str) -> Tokenized:
    """:func:`tokenize`, raising when decoding the ids does not give ``text`` back (a
    tokenizer that normalises or drops characters cannot be aligned)."""
    tok = tokenize(tokenizer, text)
    back = tokenizer.decode(tok.ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != text:
        raise ValueError(
            f"retokenize: {type(tokenizer).__name__} does not round-trip {text!r} "
            f"(decodes to {back!r})"
        )
    return tok


def retokenize(text: str, tokenizer) -> list[int]:
    """``text``'s ids under ``tokenizer`` (:func:`tokenize_exact`'s)."""
    return tokenize_exact(tokenizer, text).ids


@dataclass(frozen=True)
class Alignment:
    """Blocks of text both tokenizations cover exactly.

    ``chars[k] = (start, end)``: block ``k``'s characters; ``a[k]`` / ``b[k]``:
    ``(first, last + 1)`` token indices of side A / B in it; ``a_block`` / ``b_block``:
    each token's block (one list per side)."""

    chars: list[tuple[int, int]]
    a: list[tuple[int, int]]
    b: list[tuple[int, int]]
    a_block: list[int]
    b_block: list[int]

    def __len__(self) -> int:
        return len(self.chars)


def _ends(tok: Tokenized) -> list[int]:
    """Each token's end offset, made monotone (a token nested in its predecessor's span,
    as byte-level pieces of one character are, ends where the predecessor ends)."""
    out, hi = [], 0
    for _, e in tok.offsets:
        hi = max(hi, e)
        out.append(hi)
    return out


def align(a: Tokenized, b: Tokenized) -> Alignment:
    """The blocks of two tokenizations of the same text (see the module docstring)."""
    if a.text != b.text:
        raise ValueError("align: the two tokenizations are of different texts")
    ea, eb = _ends(a), _ends(b)
    if (ea and ea[-1] != len(a.text)) or (eb and eb[-1] != len(b.text)):
        raise ValueError("align: a tokenization does not cover the whole text")
    cuts = sorted(set(ea) & set(eb))
    chars, ra, rb, ba, bb = [], [], [], [0] * len(ea), [0] * len(eb)
    ia = ib = 0
    start = 0
    for k, c in enumerate(cuts):
        ja = ia
        while ja < len(ea) and ea[ja] <= c:
            ba[ja] = k
            ja += 1
        jb = ib
        while jb < len(eb) and eb[jb] <= c:
            bb[jb] = k
            jb += 1
        chars.append((start, c))
        ra.append((ia, ja))
        rb.append((ib, jb))
        ia, ib, start = ja, jb, c
    return Alignment(chars, ra, rb, ba, bb)


def block_sums(values: Tensor, blocks: list[tuple[int, int]]) -> Tensor:
    """``[n_blocks]``: the sum of ``values`` ``[L]`` over each block's token range."""
    if not blocks:
        return values.new_zeros(0)
    idx = torch.zeros(values.shape[0], dtype=torch.long)
    for k, (s, e) in enumerate(blocks):
        idx[s:e] = k
    return values.new_zeros(len(blocks)).index_add_(0, idx.to(values.device), values)


__all__ = [
    "Alignment",
    "Tokenized",
    "align",
    "block_sums",
    "retokenize",
    "tokenize",
    "tokenize_exact",
]
