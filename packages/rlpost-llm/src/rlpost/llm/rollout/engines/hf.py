"""Rollout engine on Hugging Face ``generate`` (CPU or GPU).

Batched sampling with KV cache and left padding; stop strings; per-token log-probs of the
sampled tokens taken from the engine's own processed scores (after temperature / top-k /
top-p), so the trainer can measure its mismatch against them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessor

from rlpost.llm.rollout.engines.base import FinishReason, LocalEngine, SamplingParams


class _FiniteLogits(LogitsProcessor):
    """A logits processor that stops generation with :class:`NonFiniteError` when a row's
    logits hold NaN or +inf or are all -inf (a diverged model), before sampling from them
    fails with an unrelated error."""

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        bad = torch.isnan(scores).any(-1) | torch.isposinf(scores).any(-1)
        bad |= torch.isneginf(scores).all(-1)
        if bool(bad.any()):
            from rlpost.core.guard import NonFiniteError

            raise NonFiniteError(
                f"the policy's logits are not finite in {int(bad.sum())} of {len(bad)} rows "
                "at generation: its weights have diverged"
            )
        return scores


class _StopStrings:
    """Per-row stop on any stop string in the generated text (works with any tokenizer;
    transformers' own ``stop_strings`` needs byte-level vocabularies)."""

    def __init__(self, tokenizer, stops: tuple[str, ...], prompt_len: int):
        self.tokenizer, self.stops, self.P = tokenizer, stops, prompt_len

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.P :], skip_special_tokens=False)
        return torch.tensor(
            [any(s in t for s in self.stops) for t in texts], device=input_ids.device
        )


class HFEngine(LocalEngine):
    """``generate`` on a transformers causal LM (``own_copy`` / ``batch_size``: see
    :class:`~rlpost.llm.rollout.engines.base.LocalEngine`)."""

    def _generate_chunk(self, prompts: list[list[int]], n: int, sp: SamplingParams):
        model = self.model
        was_training = model.training
        model.eval()
        P = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        attn = torch.zeros(len(prompts), P, dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            input_ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, P - len(p) :] = 1
        device = next(model.parameters()).device
        greedy = sp.temperature == 0
        kwargs = dict(
            do_sample=not greedy,
            max_new_tokens=sp.max_new_tokens,
            min_new_tokens=sp.min_new_tokens or None,
            num_return_sequences=n,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids) or None,
        )
        if not greedy:
            kwargs.update(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or None)
        from transformers import LogitsProcessorList

        kwargs["logits_processor"] = LogitsProcessorList([_FiniteLogits()])
        if sp.stop:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList(
                [_StopStrings(self.tokenizer, sp.stop, P)]
            )
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attn.to(device), **kwargs
        )
        model.train(was_training)
        new = out.sequences[:, P:].cpu()  # (N, L) sampled tokens
        scores = torch.stack(out.scores, dim=1).float().cpu()  # (N, L, V) processed logits
        lp = scores.log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (N, L)
        rows = []
        for i in range(new.shape[0]):
            toks, reason = self._truncate(new[i].tolist(), sp)
            rows.append((prompts[i // n], toks, lp[i, : len(toks)].tolist(), reason))
        return rows

    def _stopped_rows(self, toks: Tensor, stops: tuple[str, ...]) -> Tensor:
        """``[N]`` bool: the rows of ``toks`` whose text holds one of ``stops`` (the manual
        decode loops of the speculative and compressed-KV engines)."""
        texts = self.tokenizer.batch_decode(toks.tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in t for s in stops) for t in texts], dtype=torch.bool)

    def _truncate(self, toks: list[int], sp: SamplingParams) -> tuple[list[int], FinishReason]:
        """Cut after the first EOS (kept) or the first completed stop string (kept)."""
        for j, t in enumerate(toks):
            if t in self.eos_ids:
                return toks[: j + 1], "stop"
            if sp.stop:
                text = self.tokenizer.decode(toks[: j + 1], skip_special_tokens=False)
                if any(s in text for s in sp.stop):
                    return toks[: j + 1], "stop"
        return toks, "length"
