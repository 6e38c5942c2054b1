"""Policy ratios (the ``RATIOS`` registry): token, GSPO sequence, CTPO cumulative (001-09)."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.core.masked import masked_mean
from rlpost.core.numerics import safe_ratio
from rlpost.core.ratios.base import RATIOS, RatioInput, RatioOutput, _token_log_ratio
from rlpost.core.registry import NoParams


@RATIOS.register("token", NoParams)
def token_ratio(inp: RatioInput, p: NoParams) -> RatioOutput:
    """PPO token ratio: log r_t = log pi(y_t|x, y_<t) - log pi_old(y_t|x, y_<t)."""
    m = inp.mask.float()
    lr = _token_log_ratio(inp.logp, inp.old_logp.detach(), m)
    return RatioOutput(lr, {"ratio_mean": masked_mean(safe_ratio(lr.detach()), m).item()})


@RATIOS.register("sequence", NoParams)
def sequence_ratio(inp: RatioInput, p: NoParams) -> RatioOutput:
    """GSPO length-normalised sequence ratio (Zheng et al. 2025, arXiv:2507.18071).

    log s_i = (1/|y_i|) sum_t (log pi - log pi_old), broadcast to every valid token of
    response i, so a token-level clip acts on the sequence ratio and a
    ``seq_mean_token_mean`` aggregation gives GSPO's per-sequence objective exactly.
    grad log s_i = (1/|y_i|) sum_t grad log pi(y_t).
    """
    m = inp.mask.float()
    seq = masked_mean(_token_log_ratio(inp.logp, inp.old_logp.detach(), m), m, dim=1)
    lr = seq.unsqueeze(1) * m
    return RatioOutput(lr, {"ratio_mean": safe_ratio(seq.detach()).mean().item()})


@dataclass(frozen=True)
class CumulativeParams:
    detach_prefix: bool = True  # gradient of term t only through log pi(y_t)


@RATIOS.register("cumulative", CumulativeParams)
def cumulative_ratio(inp: RatioInput, p: CumulativeParams) -> RatioOutput:
    """CTPO cumulative token IS ratio (catalog 001-09): the prefix product of token ratios.

        log R_t = sum_{s <= t, m_s = 1} (log pi(y_s) - log pi_old(y_s)),   R_t = prod r_s

    over the valid tokens up to t (masked tokens, e.g. tool outputs, are skipped), ``[B, T]``.
    ``detach_prefix=True`` (default, the token-level policy-gradient reading): the value
    is R_t but term t's gradient flows through log pi(y_t) only,
    log R_t = sg(sum_{s<t} ...) + (log pi(y_t) - log pi_old(y_t)), so the surrogate R_t A
    gives the prefix-corrected term R_t A grad log pi(y_t). ``False``: the full gradient
    of the product (R_t A sum_{s<=t} grad log pi(y_s)).
    """
    m = inp.mask.float()
    tok = _token_log_ratio(inp.logp, inp.old_logp.detach(), m)
    csum = tok.cumsum(1)
    lr = (csum.detach() - tok.detach() + tok) if p.detach_prefix else csum
    lr = lr * m
    return RatioOutput(
        lr,
        {
            "ratio_mean": masked_mean(safe_ratio(lr.detach()), m).item(),
            "log_ratio_abs_max": (lr.detach().abs() * m).max().item() if m.numel() else 0.0,
        },
    )
