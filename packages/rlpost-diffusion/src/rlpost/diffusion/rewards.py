"""Rewards for diffusion RL: any callable ``(images, prompts) -> Tensor [B]``.

A reward (:class:`RewardFn`) takes images ``[B, C, H, W]`` in [0, 1] (what
:meth:`FlowPolicy.decode` returns) and the ``B`` prompts they were generated for, and
returns a float tensor ``[B]`` on the images' device, higher is better. Plug in any model
this way (an aesthetic predictor, an OCR or VQA scorer, a human-preference model).

Embedded rewards for the digits domain (:mod:`rlpost.diffusion.models.digits`), built on
its cached classifier (held by :class:`DigitsRewardModel`, built or loaded on first use):

* ``geneval`` -- GenEval-like binary success: 1.0 iff the classifier recognises the
  prompted digit *and* the digit is "bold" (ink mass, the mean pixel intensity, above the
  median ink mass of real training images of that class), else 0.0. Not differentiable.
* ``pickscore`` -- PickScore-like continuous preference: the classifier's logit margin
  ``logit[prompt] - max_{other} logit``. Differentiable in the images.
* ``hackable`` -- a deliberately hackable negative control: the mean ink alone.
  Saturating the image maximises it and destroys the digit; watch
  :func:`class_accuracy` (the *true* quality metric) fall while it rises.

Typical use::

    reward = make_reward("geneval")
    r = reward(policy.decode(x), prompts)      # [B] in {0, 1}
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpost.core.io.cache import default_cache_dir
from rlpost.diffusion.models.digits.classifier import (
    DigitsClassifier,
    build_digits_classifier,
    load_digits_classifier,
)
from rlpost.diffusion.models.digits.data import (
    N_CLASSES,
    class_ink_medians,
    mean_ink,
    parse_digit_prompts,
)

__all__ = [
    "REWARDS",
    "DigitsRewardModel",
    "ImageReward",
    "RewardFn",
    "RewardScorer",
    "Scored",
    "class_accuracy",
    "default_reward_model",
    "geneval",
    "hackable",
    "load_reward",
    "make_reward",
    "mean_ink",
    "pickscore",
    "quality_metrics",
]


@runtime_checkable
class RewardFn(Protocol):
    """``reward(images, prompts) -> Tensor [B]``.

    ``images``: ``[B, C, H, W]`` in [0, 1]; ``prompts``: the ``B`` prompts (class ids for
    digits, strings for text-to-image). Returns a float tensor ``[B]`` on ``images``'
    device, higher is better; must not modify its inputs. It may or may not be
    differentiable in ``images`` (say which in its docstring).
    """

    def __call__(self, images: Tensor, prompts: Sequence[Any]) -> Tensor: ...


class DigitsRewardModel:
    """The digits classifier behind the embedded rewards, built or loaded lazily.

    Args:
        path: folder of a built classifier (:func:`build_digits_classifier`); default the
            default classifier in ``cache_dir``, built on first use (a few seconds).
        cache_dir: cache root (default ``$RLPOST_CACHE`` / the user cache dir).
        progress: show build progress if the classifier has to be built.

    The classifier is moved to the images' device on use. Methods taking
    ``(images, prompts)`` are :class:`RewardFn` s; images must be 8x8 (channels are
    averaged), prompts digits (ints 0-9 or ``"0"``-``"9"``).
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ):
        self.path = Path(path) if path is not None else None
        self.cache_dir = cache_dir
        self.progress = progress
        self._classifier: DigitsClassifier | None = None

    @property
    def classifier(self) -> DigitsClassifier:
        """The frozen classifier (images ``[B, 1, 8, 8]`` in [0, 1] -> logits ``[B, 10]``)."""
        if self._classifier is None:
            if self.path is None:
                self.path = build_digits_classifier(self.cache_dir, progress=self.progress)
            self._classifier = load_digits_classifier(self.path)
        return self._classifier

    def _prepare(self, images: Tensor, prompts: Sequence[Any]) -> tuple[Tensor, Tensor]:
        if images.ndim != 4 or images.shape[-2:] != (8, 8):
            raise ValueError(f"digit rewards expect images [B, C, 8, 8], got {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        labels = parse_digit_prompts(prompts).to(images.device)
        return images.float().mean(dim=1, keepdim=True), labels

    def logits(self, images: Tensor) -> Tensor:
        """Classifier logits ``[B, 10]`` of images ``[B, 1, 8, 8]`` in [0, 1]."""
        clf = self.classifier
        if next(clf.parameters()).device != images.device:
            clf.to(images.device)
        return clf(images)

    def correct(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        """``[B]`` bool: the classifier's argmax is the prompted digit."""
        x, labels = self._prepare(images, prompts)
        with torch.no_grad():
            return self.logits(x).argmax(-1) == labels

    def recognised(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        """``[B]`` float in {0, 1}: :meth:`correct` as a per-sample metric (a RewardFn)."""
        return self.correct(images, prompts).float()

    def class_accuracy(self, images: Tensor, prompts: Sequence[Any]) -> float:
        """Fraction of images recognised as their prompted digit (the true quality metric)."""
        return self.correct(images, prompts).float().mean().item()

    def geneval(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        """GenEval-like binary success in {0, 1}: recognised as the prompted digit AND bold
        (ink mass above that class's median over real training images). No gradient."""
        x, labels = self._prepare(images, prompts)
        with torch.no_grad():
            correct = self.logits(x).argmax(-1) == labels
            bold = mean_ink(x) > class_ink_medians().to(x.device)[labels]
        return (correct & bold).float()

    def pickscore(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        """PickScore-like logit margin ``logit[prompt] - max over other classes`` (> 0 iff
        recognised). Differentiable in ``images``."""
        x, labels = self._prepare(images, prompts)
        logits = self.logits(x)
        own = logits.gather(1, labels[:, None]).squeeze(1)
        mask = F.one_hot(labels, N_CLASSES).bool()
        return own - logits.masked_fill(mask, float("-inf")).amax(-1)

    def hackable(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        """Mean ink, ignoring the prompt and the classifier (see :func:`hackable`)."""
        return hackable(images, prompts)


_DEFAULT_MODELS: dict[str, DigitsRewardModel] = {}


def default_reward_model(cache_dir: str | os.PathLike | None = None) -> DigitsRewardModel:
    """The shared :class:`DigitsRewardModel` of the default classifier in ``cache_dir``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = str(root.resolve())
    if key not in _DEFAULT_MODELS:
        _DEFAULT_MODELS[key] = DigitsRewardModel(cache_dir=root)
    return _DEFAULT_MODELS[key]


def geneval(images: Tensor, prompts: Sequence[Any]) -> Tensor:
    """GenEval-like binary reward of the default classifier (:meth:`DigitsRewardModel.geneval`)."""
    return default_reward_model().geneval(images, prompts)


def pickscore(images: Tensor, prompts: Sequence[Any]) -> Tensor:
    """Logit-margin reward of the default classifier (:meth:`DigitsRewardModel.pickscore`)."""
    return default_reward_model().pickscore(images, prompts)


def hackable(images: Tensor, prompts: Sequence[Any]) -> Tensor:
    """Negative control: mean ink ``[B]`` (prompts ignored). Maximal (1.0) for an all-ink
    (all-white when shown) image, which is no digit at all. Differentiable."""
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    return mean_ink(images)


def class_accuracy(
    images: Tensor, prompts: Sequence[Any], cache_dir: str | os.PathLike | None = None
) -> float:
    """Fraction of ``images`` the default classifier recognises as their prompted digit:
    the true quality metric to report next to (hackable) rewards."""
    return default_reward_model(cache_dir).class_accuracy(images, prompts)


RewardFactory = Callable[[str | os.PathLike | None], RewardFn]


def _classifier_reward(method: str) -> RewardFactory:
    def factory(cache_dir: str | os.PathLike | None = None) -> RewardFn:
        return getattr(default_reward_model(cache_dir), method)

    factory.__name__ = f"{method}_factory"
    return factory


def _hackable_factory(cache_dir: str | os.PathLike | None = None) -> RewardFn:
    return hackable


#: name -> factory ``(cache_dir) -> RewardFn``; register your own here to use it by name.
REWARDS: dict[str, RewardFactory] = {
    "geneval": _classifier_reward("geneval"),
    "pickscore": _classifier_reward("pickscore"),
    "hackable": _hackable_factory,
}


def make_reward(name: str, cache_dir: str | os.PathLike | None = None) -> RewardFn:
    """The reward registered as ``name`` in :data:`REWARDS` (classifier rewards share the
    default classifier in ``cache_dir``, built on first use)."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid rewards: {', '.join(sorted(REWARDS))}")
    return REWARDS[name](cache_dir)


def load_reward(spec: str, cache_dir: str | os.PathLike | None = None) -> RewardFn:
    """A reward by name: a key of :data:`REWARDS`, or ``"package.module:attribute"`` naming
    a user reward (any callable ``(images, prompts) -> Tensor [B]``, returned as is)."""
    if ":" not in spec:
        return make_reward(spec, cache_dir)
    from rlpost.core.io.config import import_object

    return import_object(spec, "reward.name")


def quality_metrics(
    model_name: str, cache_dir: str | os.PathLike | None = None
) -> dict[str, RewardFn]:
    """Per-sample metrics to log next to the reward, by model name.

    For the digits models (``"digits"``, ``"digits-random"``): ``class_accuracy`` (1.0 if
    the classifier recognises the prompted digit: the true quality, which a hacked reward
    lets fall), ``geneval``, ``pickscore`` and ``ink`` (mean ink, what ``hackable``
    rewards). Other models: none (``{}``). Each is a :class:`RewardFn`; average for rates.
    """
    if not model_name.startswith("digits"):
        return {}
    model = default_reward_model(cache_dir)
    return {
        "class_accuracy": model.recognised,
        "geneval": model.geneval,
        "pickscore": model.pickscore,
        "ink": hackable,
    }


# ------------------------------------------------------------------ scoring with limits


class ImageReward:
    """A :class:`RewardFn` as a :class:`rlpost.core.pool.RewardPool` function: one item is
    one image ``[C, H, W]`` and its prompt, scored as a batch of one. Picklable when the
    reward is (a module-level function or an instance of a module-level class)."""

    def __init__(self, fn: RewardFn):
        self.fn = fn
        if callable(getattr(fn, "warmup", None)):
            self.warmup = fn.warmup

    def __call__(self, image: Tensor, prompt: Any) -> float:
        out = torch.as_tensor(self.fn(image[None], [prompt]))
        if out.numel() != 1:
            raise ValueError(f"returned {out.numel()} values for one image")
        return float(out.reshape(()))


@dataclass
class Scored:
    """Rewards of one batch: ``rewards [B]`` float32 with NaN where scoring failed or the
    value is not finite in float32; ``metrics`` (``reward/errors``, ``reward/timeouts``,
    ``reward/oom``, ``reward/nonfinite``: counts); ``failures``: a reason per failed item."""

    rewards: Tensor
    metrics: dict[str, float]
    failures: list[str]

    @property
    def bad(self) -> int:
        return int(torch.isnan(self.rewards).sum())


class RewardScorer:
    """Scores ``(images, prompts)`` with a reward, so that no reward can crash, hang or
    poison the run: with ``workers > 0`` in a :class:`rlpost.core.pool.RewardPool` (one
    image per item, each under ``timeout_s`` and ``memory_mb``), with ``workers = 0`` in
    this process, batched (an exception fails the whole batch). Failed or non-finite
    items come back as NaN and are counted."""

    def __init__(
        self,
        fn: RewardFn,
        name: str,
        workers: int = 0,
        timeout_s: float = 30.0,
        memory_mb: float | None = 1024.0,
    ):
        self.fn, self.name = fn, name
        self.pool = None
        if workers > 0:
            from rlpost.core.pool import RewardPool

            self.pool = RewardPool(
                {name: ImageReward(fn)}, workers=workers, timeout_s=timeout_s, memory_mb=memory_mb
            )

    def __call__(self, images: Tensor, prompts: Sequence[Any]) -> Scored:
        from rlpost.core.guard import finite_or_nan

        B = images.shape[0]
        failures: list[str] = []
        metrics = {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/oom": 0.0}
        if self.pool is not None:
            res = self.pool.score(list(images.detach().cpu()), list(prompts))
            raw = res.components[:, 0].clone()
            raw[res.failed[:, 0]] = math.nan
            for k in metrics:
                metrics[k] = res.metrics[k]
            failures = [f"{kind}: {why}" for _, _, kind, why in self.pool.last_failures]
        else:
            try:
                raw = torch.as_tensor(self.fn(images, prompts)).detach().reshape(-1).cpu()
                if raw.numel() != B:
                    raise ValueError(f"returned {raw.numel()} values for {B} images")
            except Exception as e:  # the batch fails, the run does not
                raw = torch.full((B,), math.nan)
                metrics["reward/errors"] = float(B)
                failures = [f"error: {type(e).__name__}: {e}"]
        failed = int(torch.isnan(raw.double()).sum())
        rewards, bad = finite_or_nan(raw)
        metrics["reward/nonfinite"] = float(bad - failed)
        if bad > failed:
            failures.append(f"{bad - failed} non-finite value(s) (float32)")
        return Scored(rewards.to(images.device), metrics, failures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
