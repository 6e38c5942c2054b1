"""GAC (catalog 000-06): noise-aware SFT/RL mixing controller."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlpost.core.contract import Coupling, Input
from rlpost.core.regularizers.base import REGULARIZERS, GradientInput, GradientOutput


@dataclass(frozen=True)
class GACSignals:
    """One step's noise / disagreement estimates (squared gradient-norm units)."""

    sft_var: float  # tr Cov of the mean SFT gradient of the step
    rl_var: float  # tr Cov of the mean RL gradient of the step
    disagreement: float  # estimate of ||E g_sft - E g_rl||^2 (noise-corrected, >= 0)


def gac_signals(sft_grads: Tensor, rl_grads: Tensor) -> GACSignals:
    """Noise and disagreement of the SFT and RL gradients from ``K`` micro-batch samples.

    ``sft_grads``, ``rl_grads``: ``[K, D]`` per-micro-batch gradients (``K >= 2``; any
    subset of the parameters, e.g. the last layers, keeps the overhead small). With
    ``gbar = mean_k g_k``:

        v     = sum_k ||g_k - gbar||^2 / (K (K - 1))        (variance of gbar, unbiased)
        d     = max(0, ||gbar_sft - gbar_rl||^2 - v_sft - v_rl)

    ``d`` is an unbiased (then clipped) estimate of the squared distance between the two
    expected gradients: the noise of the two means inflates ``||gbar_sft - gbar_rl||^2``
    by exactly ``v_sft + v_rl`` in expectation.
    """
    if sft_grads.dim() != 2 or sft_grads.shape != rl_grads.shape:
        raise ValueError(
            f"need two [K, D] gradient stacks of one shape, got {tuple(sft_grads.shape)} "
            f"and {tuple(rl_grads.shape)}"
        )
    K = sft_grads.shape[0]
    if K < 2:
        raise ValueError(f"variance needs K >= 2 micro-batch gradients, got {K}")
    s, r = sft_grads.double(), rl_grads.double()
    ms, mr = s.mean(0), r.mean(0)
    vs = ((s - ms) ** 2).sum() / (K * (K - 1))
    vr = ((r - mr) ** 2).sum() / (K * (K - 1))
    d = (((ms - mr) ** 2).sum() - vs - vr).clamp(min=0)
    return GACSignals(vs.item(), vr.item(), d.item())


class GACController:
    """GAC (catalog 000-06): adaptive SFT/RL mixing weight ``lam`` (weight of the SFT loss).

    Our reading of "a noise-aware controller that derives an adaptive mixing weight from
    online estimates of gradient variance and disagreement": the RL gradient ``g_rl`` is an
    unbiased but noisy estimate of the wanted direction ``g*``; the SFT gradient is less
    noisy but biased by ``g_sft - g_rl``. The mix ``lam g_sft + (1 - lam) g_rl`` has mean
    squared error ``lam^2 (v_sft + d) + (1 - lam)^2 v_rl``, minimised by

        lam* = (v_rl + eps) / (v_rl + v_sft + d + 2 eps)

    so ``lam`` rises with the RL noise and falls with the SFT noise and the disagreement.
    The abstract's three additions:

    1. *smoothing*: the signals are EMAs with factor ``smoothing`` (the first update sets
       them);
    2. *prior guidance*: ``target = (1 - prior_weight) lam* + prior_weight prior``;
    3. *bounded updates*: ``lam <- clip(lam + clip(target - lam, -max_step, max_step),
       lam_min, lam_max)``.

    Constant signals make ``target`` constant, so ``lam`` reaches the fixed point
    ``clip(target, lam_min, lam_max)`` in at most ``ceil(1 / max_step)`` updates and stays.
    Usage per step: ``lam = ctl.update(gac_signals(G_sft, G_rl))``, then
    ``loss = ctl.mix(sft_loss, rl_loss)``.
    """

    def __init__(
        self,
        init: float = 0.5,
        prior: float = 0.5,
        prior_weight: float = 0.1,
        smoothing: float = 0.9,
        max_step: float = 0.05,
        lam_min: float = 0.0,
        lam_max: float = 1.0,
        eps: float = 1e-12,
    ):
        if not 0.0 <= lam_min <= lam_max <= 1.0:
            raise ValueError(f"need 0 <= lam_min <= lam_max <= 1, got {lam_min}, {lam_max}")
        if not lam_min <= init <= lam_max:
            raise ValueError(f"init {init} is outside [lam_min, lam_max]")
        if not 0.0 <= prior <= 1.0 or not 0.0 <= prior_weight <= 1.0:
            raise ValueError(
                f"prior and prior_weight must lie in [0, 1], got {prior}, {prior_weight}"
            )
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        if max_step <= 0 or eps <= 0:
            raise ValueError(f"need max_step > 0 and eps > 0, got {max_step}, {eps}")
        self.lam = float(init)
        self.prior, self.prior_weight = prior, prior_weight
        self.smoothing, self.max_step = smoothing, max_step
        self.lam_min, self.lam_max, self.eps = lam_min, lam_max, eps
        self._ema: tuple[float, float, float] | None = None

    def target(self, s: GACSignals) -> float:
        """Prior-guided target ``(1 - rho) lam*(s) + rho prior`` of (smoothed) signals ``s``."""
        if min(s.sft_var, s.rl_var, s.disagreement) < 0:
            raise ValueError(f"signals must be >= 0, got {s}")
        star = (s.rl_var + self.eps) / (s.rl_var + s.sft_var + s.disagreement + 2 * self.eps)
        return (1 - self.prior_weight) * star + self.prior_weight * self.prior

    def update(self, s: GACSignals) -> float:
        """Smooth the signals, move ``lam`` a bounded step towards the target; return it."""
        new = (s.sft_var, s.rl_var, s.disagreement)
        b = self.smoothing
        ema = (
            new
            if self._ema is None
            else tuple(b * o + (1 - b) * n for o, n in zip(self._ema, new, strict=True))
        )
        self._ema = ema  # type: ignore[assignment]
        t = self.target(GACSignals(*ema))
        step = min(max(t - self.lam, -self.max_step), self.max_step)
        self.lam = min(max(self.lam + step, self.lam_min), self.lam_max)
        return self.lam

    def mix(self, sft_loss: Tensor, rl_loss: Tensor) -> Tensor:
        """``lam L_sft + (1 - lam) L_rl`` with the current ``lam``."""
        return self.lam * sft_loss + (1.0 - self.lam) * rl_loss

    def state_dict(self) -> dict:
        return {"lam": self.lam, "ema": self._ema}

    def load_state_dict(self, state: dict) -> None:
        self.lam = float(state["lam"])
        self._ema = None if state["ema"] is None else tuple(state["ema"])


@dataclass(frozen=True)
class GACParams:
    """:class:`GACController`'s settings (see it for their meaning)."""

    init: float = 0.5
    prior: float = 0.5
    prior_weight: float = 0.1
    smoothing: float = 0.9
    max_step: float = 0.05
    lam_min: float = 0.0
    lam_max: float = 1.0

    def __post_init__(self) -> None:
        self.controller()  # validates

    def controller(self) -> GACController:
        return GACController(
            self.init,
            self.prior,
            self.prior_weight,
            self.smoothing,
            self.max_step,
            self.lam_min,
            self.lam_max,
        )


@REGULARIZERS.register(
    "gac", GACParams, needs={Input.AUX_GRADIENTS, Input.GRAD_SAMPLES}, coupling=Coupling.BATCH
)
def gac(inp: GradientInput, p: GACParams) -> GradientOutput:
    """GAC (catalog 000-06) as a gradient transform: the step's update is

        g = lam * mean_m(aux_grads) + (1 - lam) * grad

    i.e. the gradient of ``lam L_sft + (1 - lam) L_rl`` with ``aux_grads`` the SFT-data
    gradients, and ``lam`` the controller's weight after it saw this step's signals
    (:func:`gac_signals` of ``aux_grads`` and ``grad_samples``, both ``K >= 2`` rows).
    ``state``: the controller's ``lam`` and smoothed signals.
    """
    ctl = p.controller()
    if inp.state:
        ctl.load_state_dict(dict(inp.state))
    aux, samples = inp.aux_grads, inp.grad_samples
    k = min(aux.shape[0], samples.shape[0])
    sig = gac_signals(aux[:k], samples[:k])
    lam = ctl.update(sig)
    g = lam * aux.mean(0).to(inp.grad.dtype) + (1.0 - lam) * inp.grad
    metrics = {
        "gac/lambda": lam,
        "gac/sft_var": sig.sft_var,
        "gac/rl_var": sig.rl_var,
        "gac/disagreement": sig.disagreement,
    }
    return GradientOutput(g, ctl.state_dict(), metrics)
