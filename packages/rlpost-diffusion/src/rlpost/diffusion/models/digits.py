"""The embedded default of the diffusion domain: a class-conditional flow model of 8x8 digits.

Nothing is downloaded: the data are scikit-learn's ``load_digits`` (1,797 8x8 images,
values 0..16, shipped in the wheel), split once into 1,500 train / 297 held-out images
by a seeded permutation (:func:`digits_split`).

Spaces:

* **images** ``[B, 1, 8, 8]`` in [0, 1] (``img / 16``; 1 = full ink), what rewards and
  the classifier see;
* **model space** ``x = 2 * image - 1 = img / 8 - 1`` in [-1, 1], what the flow lives in
  (:func:`to_model_space`; :meth:`DigitsPolicy.decode` is the inverse, clamped).

The flow follows :mod:`rlpost.diffusion.models.base`: ``x_sigma = (1 - sigma) x0 + sigma
eps``, velocity target ``eps - x0``, ``sigma = 1`` noise, ``sigma = 0`` clean.

Built artefacts live in ``<cache>/diffusion/`` (cache root ``$RLPOST_CACHE``, else the
platform user cache dir of ``rlpost``), one content-hashed folder per recipe, written into a
temporary sibling folder and renamed into place once complete (its info JSON marks it so):

* :func:`build_digits_classifier` -> ``digits-classifier-<hash>/classifier.safetensors``,
  the reward / evaluation classifier (a small MLP, ~98.7% held-out accuracy, ~10 s);
* :func:`build_digits_base` -> ``digits-<hash>/velocity.safetensors``, the pretrained
  :class:`DigitsVelocityNet` (~30 s). Good but imperfect: trained with 10% label noise,
  its samples are clean digits of the requested class ~85% of the time (the others are
  other digits), so RL post-training has headroom.

Typical use::

    policy = DigitsPolicy.pretrained()     # ~40 s on one CPU core the first time, cached
    cond = policy.encode([3, 3, 7])
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import numbers
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from rlpost.core.io.cache import cache_entry, default_cache_dir, merge_params, publish_directory
from rlpost.diffusion.models.base import Cond

__all__ = [
    "BASE_DEFAULTS",
    "CLASSIFIER_DEFAULTS",
    "DIGITS_VERSION",
    "DigitsClassifier",
    "DigitsPolicy",
    "DigitsSplit",
    "DigitsVelocityNet",
    "base_path",
    "build_digits_base",
    "build_digits_classifier",
    "class_ink_medians",
    "classifier_accuracy",
    "classifier_path",
    "default_cache_dir",
    "digits_split",
    "euler_sample",
    "evaluate_samples",
    "flow_matching_loss",
    "heldout_fm_loss",
    "load_digits_classifier",
    "load_digits_net",
    "parse_digit_prompts",
    "to_model_space",
    "train_classifier",
    "train_flow_matching",
]

log = logging.getLogger(__name__)

#: Bumped whenever a recipe changes in a way that invalidates cached builds.
DIGITS_VERSION = 1

#: Number of classes (digits 0-9) and pixels per image.
N_CLASSES = 10
N_PIXELS = 64

#: Defaults of :func:`build_digits_base` (explicit arguments override them).
BASE_DEFAULTS: dict[str, Any] = {
    "steps": 1500,
    "batch_size": 256,
    "lr": 1e-3,
    "weight_decay": 0.01,
    "label_noise": 0.1,
    "seed": 0,
    "hidden": 256,
    "n_blocks": 3,
    "emb_dim": 64,
}

#: Defaults of :func:`build_digits_classifier`.
CLASSIFIER_DEFAULTS: dict[str, Any] = {
    "steps": 1000,
    "batch_size": 128,
    "lr": 2e-3,
    "weight_decay": 0.01,
    "noise_std": 0.15,
    "seed": 0,
}

#: Samples (balanced over the classes) and Euler steps of the builder's sample evaluation.
EVAL_SAMPLES = 512
EVAL_EULER_STEPS = 20


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed split; images ``[N, 1, 8, 8]`` float32 in [0, 1], labels ``[N]`` int64."""

    train_images: Tensor
    train_labels: Tensor
    heldout_images: Tensor
    heldout_labels: Tensor


@functools.cache
def digits_split(n_train: int = 1500, seed: int = 0) -> DigitsSplit:
    """scikit-learn's digits, split by a seeded permutation (numpy PCG64, stable).

    The default ``(1500, 0)`` split is the one every builder and reward uses. Cached:
    treat the returned tensors as read-only.
    """
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    with torch.inference_mode(False):  # cached: must be usable by later training
        images = torch.from_numpy(data.images.astype(np.float32) / 16.0).unsqueeze(1)
        labels = torch.from_numpy(data.target.astype(np.int64))
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(labels)))
        tr, ho = perm[:n_train], perm[n_train:]
        return DigitsSplit(images[tr], labels[tr], images[ho], labels[ho])


@functools.cache
def class_ink_medians() -> Tensor:
    """``[10]``: per class, the median ink mass (mean pixel intensity in [0, 1]) of the
    real training images of that class; the "bold" threshold of the GenEval-like reward."""
    split = digits_split()
    ink = split.train_images.mean(dim=(1, 2, 3))
    return torch.stack([ink[split.train_labels == c].median() for c in range(N_CLASSES)])


def to_model_space(images: Tensor) -> Tensor:
    """Images in [0, 1] -> model space ``2 * image - 1`` in [-1, 1]."""
    return images * 2.0 - 1.0


def parse_digit_prompts(prompts: Sequence[Any] | Tensor) -> Tensor:
    """Class ids ``[B]`` (int64, CPU) from prompts: ints 0-9 or strings ``"0"``-``"9"``.

    Also accepts a 1-D integer tensor. Anything else (floats, bools, ``"seven"``, 10)
    raises ``ValueError`` naming the bad prompt and its index.
    """
    if isinstance(prompts, Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype == torch.bool or prompts.ndim != 1:
            raise ValueError(
                f"digit prompts as a tensor must be 1-D integer, got {prompts.dtype} "
                f"of shape {tuple(prompts.shape)}"
            )
        prompts = prompts.tolist()
    labels = []
    for i, p in enumerate(prompts):
        value: int | None = None
        if isinstance(p, Tensor) and p.ndim == 0 and not p.dtype.is_floating_point:
            p = p.item()
        if isinstance(p, numbers.Integral) and not isinstance(p, bool):
            value = int(p)
        elif isinstance(p, str) and len(p.strip()) == 1 and p.strip().isdigit():
            value = int(p.strip())
        if value is None or not 0 <= value < N_CLASSES:
            raise ValueError(
                f"invalid digit prompt {p!r} at index {i}: expected an int 0-9 or a string '0'-'9'"
            )
        labels.append(value)
    return torch.tensor(labels, dtype=torch.long)


# ----------------------------------------------------------------------------- velocity net


def _with_grad(fn):
    """Run ``fn`` with autograd on and outside inference mode: builders and loaders may be
    called lazily from ``no_grad`` / ``inference_mode`` code (e.g. a reward's first call),
    and must still train, and create parameters that can later be differentiated through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.enable_grad():
            return fn(*args, **kwargs)

    return wrapper


def sinusoidal_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """``[B, dim]`` sin/cos features of ``t`` ``[B]`` (DDPM / DiT style)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class _ResBlock(nn.Module):
    """``h + W(SiLU(LayerNorm(h) + c))``: a residual block with additive conditioning."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, h: Tensor, c: Tensor) -> Tensor:
        return h + self.fc(F.silu(self.norm(h) + c))


class DigitsVelocityNet(nn.Module):
    """Class-conditional velocity field ``v(x, sigma, labels)`` on 8x8 images.

    An MLP on the 64 flattened pixels: input projection, ``n_blocks`` residual blocks
    (LayerNorm + SiLU + Linear) to which the conditioning ``c = MLP(sin-emb(1000 sigma))
    + Embedding(label)`` is added, then LayerNorm + SiLU + a zero-initialised output
    layer (so ``v = 0`` at initialisation). ~317k parameters with the defaults.

    Args of ``forward``: ``x`` ``[B, 1, 8, 8]`` (model space), ``sigma`` ``[B]`` (or a
    scalar) in [0, 1], ``labels`` ``[B]`` int64; returns ``[B, 1, 8, 8]``.
    """

    def __init__(
        self, hidden: int = 256, n_blocks: int = 3, emb_dim: int = 64, n_classes: int = N_CLASSES
    ):
        super().__init__()
        self.config = {
            "hidden": hidden,
            "n_blocks": n_blocks,
            "emb_dim": emb_dim,
            "n_classes": n_classes,
        }
        self.emb_dim = emb_dim
        self.inp = nn.Linear(N_PIXELS, hidden)
        self.sigma_mlp = nn.Sequential(
            nn.Linear(emb_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden)
        )
        self.label_emb = nn.Embedding(n_classes, hidden)
        self.blocks = nn.ModuleList(_ResBlock(hidden) for _ in range(n_blocks))
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, N_PIXELS)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: Tensor, sigma: Tensor, labels: Tensor) -> Tensor:
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, device=x.device, dtype=x.dtype)
        if sigma.ndim == 0:
            sigma = sigma.expand(b)
        c = self.sigma_mlp(sinusoidal_embedding(sigma * 1000.0, self.emb_dim).to(x.dtype))
        c = c + self.label_emb(labels)
        h = self.inp(x.reshape(b, N_PIXELS))
        for block in self.blocks:
            h = block(h, c)
        return self.out(F.silu(self.out_norm(h))).reshape(x.shape)


def flow_matching_loss(
    net: Callable[[Tensor, Tensor, Tensor], Tensor],
    x0: Tensor,
    labels: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Rectified-flow regression ``mean ||v(x_sigma, sigma, y) - (eps - x0)||^2``.

    ``sigma = sigmoid(n)``, ``n ~ N(0, 1)`` (logit-normal, as SD3 pretraining);
    ``x_sigma = (1 - sigma) x0 + sigma eps``. Mean over pixels and batch.
    """
    b = x0.shape[0]
    eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    sigma = torch.sigmoid(torch.randn(b, generator=generator, device=x0.device, dtype=x0.dtype))
    s = sigma.view(b, *([1] * (x0.ndim - 1)))
    x_sigma = (1.0 - s) * x0 + s * eps
    return F.mse_loss(net(x_sigma, sigma, labels), eps - x0)


@_with_grad
def train_flow_matching(
    net: DigitsVelocityNet,
    x0: Tensor,
    labels: Tensor,
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    label_noise: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Flow-matching pretraining of ``net`` in place on ``(x0, labels)`` (model space).

    AdamW, gradient norm clipped to 1, linear warmup (5%) then cosine decay to ``lr / 10``;
    each step draws a batch with replacement. With ``label_noise = p`` each example's
    conditioning label is replaced, with probability ``p``, by a uniformly drawn *other*
    class, so the model learns ``p(x | y) = (1 - p) p_data(x | y) + p / 9 sum_{y' != y}
    p_data(x | y')``: clean-looking digits that follow the prompt only ~``1 - p`` of the
    time (an imperfect prompt follower, like real text-to-image bases). Returns the
    per-step training losses and leaves ``net`` in eval mode.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    net.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="digits flow", disable=not progress, leave=False, file=sys.stderr)
    for _ in bar:
        idx = torch.randint(len(labels), (batch_size,), generator=gen)
        y = labels[idx]
        if label_noise > 0:
            flip = torch.rand(batch_size, generator=gen) < label_noise
            shift = torch.randint(1, N_CLASSES, (batch_size,), generator=gen)
            y = torch.where(flip, (y + shift) % N_CLASSES, y)
        loss = flow_matching_loss(net, x0[idx], y, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress and len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.4f}")
    bar.close()
    net.eval()
    return losses


def _warmup_cosine(steps: int) -> Callable[[int], float]:
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@torch.no_grad()
def heldout_fm_loss(net: DigitsVelocityNet, repeats: int = 8, seed: int = 1234) -> float:
    """Flow-matching loss on the held-out split, each image ``repeats`` times, fixed noise."""
    split = digits_split()
    x0 = to_model_space(split.heldout_images).repeat(repeats, 1, 1, 1)
    labels = split.heldout_labels.repeat(repeats)
    gen = torch.Generator().manual_seed(seed)
    return flow_matching_loss(net, x0, labels, generator=gen).item()


@torch.no_grad()
def euler_sample(
    velocity: Callable[[Tensor, Tensor, Tensor], Tensor],
    labels: Tensor,
    steps: int = 20,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """Minimal deterministic Euler ODE sampler (used by the builder and tests).

    Integrates ``dx/dsigma = v`` on ``steps`` uniform steps from ``sigma = 1`` (noise
    ``[B, 1, 8, 8]``, or ``noise`` if given) to ``sigma = 0``; ``velocity(x, sigma[B],
    labels)``. Returns model-space samples (the project's sampler module has the real ones).
    """
    b = labels.shape[0]
    if noise is None:
        noise = torch.randn((b, 1, 8, 8), generator=generator).to(labels.device)
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1, device=x.device)
    for i in range(steps):
        s = sigmas[i].expand(b)
        x = x + (sigmas[i + 1] - sigmas[i]) * velocity(x, s, labels)
    return x


@_with_grad
def load_digits_net(path: str | os.PathLike) -> DigitsVelocityNet:
    """A :class:`DigitsVelocityNet` from a :func:`build_digits_base` folder (or the
    ``velocity.safetensors`` file itself), in eval mode on CPU."""
    from safetensors.torch import load_file

    file = Path(path)
    if file.is_dir():
        file = file / "velocity.safetensors"
    info = json.loads((file.parent / "base_info.json").read_text())
    net = DigitsVelocityNet(**info["net"])
    net.load_state_dict(load_file(file))
    return net.eval()


# ----------------------------------------------------------------------------- classifier


class DigitsClassifier(nn.Module):
    """A small MLP: images ``[B, 1, 8, 8]`` in [0, 1] -> logits ``[B, 10]``.

    ``64 -> hidden -> hidden -> 10`` with SiLU; ~85k parameters with the default width.
    """

    def __init__(self, hidden: int = 256):
        super().__init__()
        self.hidden = hidden
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(N_PIXELS, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, N_CLASSES),
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)


@_with_grad
def train_classifier(
    clf: DigitsClassifier,
    images: Tensor,
    labels: Tensor,
    steps: int,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 0.01,
    noise_std: float = 0.15,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Cross-entropy training with light augmentation: Gaussian pixel noise of a random
    std in ``[0, noise_std]`` per image, clamped to [0, 1]. Returns per-step losses."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(clf.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    clf.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="digits clf", disable=not progress, leave=False, file=sys.stderr)
    for _ in bar:
        idx = torch.randint(len(labels), (batch_size,), generator=gen)
        x = images[idx]
        std = torch.rand(batch_size, 1, 1, 1, generator=gen) * noise_std
        x = (x + std * torch.randn(x.shape, generator=gen)).clamp(0.0, 1.0)
        loss = F.cross_entropy(clf(x), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    bar.close()
    clf.eval()
    return losses


@torch.no_grad()
def classifier_accuracy(clf: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Fraction of ``images`` (in [0, 1]) whose argmax logit is the label."""
    return (clf(images).argmax(-1) == labels).float().mean().item()


@_with_grad
def load_digits_classifier(path: str | os.PathLike) -> DigitsClassifier:
    """A :class:`DigitsClassifier` from a :func:`build_digits_classifier` folder (or the
    ``classifier.safetensors`` file), in eval mode on CPU with gradients disabled."""
    from safetensors.torch import load_file

    file = Path(path)
    if file.is_dir():
        file = file / "classifier.safetensors"
    info = json.loads((file.parent / "classifier_info.json").read_text())
    clf = DigitsClassifier(**info["net"])
    clf.load_state_dict(load_file(file))
    clf.requires_grad_(False)
    return clf.eval()


# ----------------------------------------------------------------------------- cache


def _hashed_path(cache_dir: str | os.PathLike | None, prefix: str, recipe: dict) -> Path:
    return cache_entry("diffusion", prefix, {**recipe, "version": DIGITS_VERSION}, cache_dir)


_merge = merge_params


def base_path(cache_dir: str | os.PathLike | None = None, **params: Any) -> Path:
    """Where :func:`build_digits_base` with these parameters stores its build:
    ``<cache>/diffusion/digits-<hash of the recipe>``."""
    return _hashed_path(cache_dir, "digits", _merge(BASE_DEFAULTS, params))


def classifier_path(cache_dir: str | os.PathLike | None = None, **params: Any) -> Path:
    """Where :func:`build_digits_classifier` stores its build:
    ``<cache>/diffusion/digits-classifier-<hash of the recipe>``."""
    return _hashed_path(cache_dir, "digits-classifier", _merge(CLASSIFIER_DEFAULTS, params))


def _is_complete(path: Path, info_name: str) -> bool:
    return (path / info_name).is_file()


def _say(progress: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        log.info(msg)
        if progress:
            tqdm.write(msg, file=sys.stderr)

    return say


# ----------------------------------------------------------------------------- builders


@_with_grad
def build_digits_classifier(
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    *,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    noise_std: float | None = None,
    seed: int | None = None,
) -> Path:
    """Build (or find in the cache) the reward / evaluation classifier.

    A :class:`DigitsClassifier` trained on the train split (:func:`train_classifier`,
    noise augmentation). Saves ``classifier.safetensors`` and ``classifier_info.json``
    (recipe, steps, seconds, held-out accuracy) into :func:`classifier_path`. Returns
    the folder (load it with :func:`load_digits_classifier`). ``None`` arguments take
    :data:`CLASSIFIER_DEFAULTS`; ``force`` rebuilds even if a finished build exists.
    """
    recipe = _merge(
        CLASSIFIER_DEFAULTS,
        {
            "steps": steps,
            "batch_size": batch_size,
            "lr": lr,
            "weight_decay": weight_decay,
            "noise_std": noise_std,
            "seed": seed,
        },
    )
    target = classifier_path(cache_dir, **recipe)
    if _is_complete(target, "classifier_info.json") and not force:
        log.info("using cached digits classifier %s", target)
        return target
    say = _say(progress)
    t0 = time.perf_counter()
    split = digits_split()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        clf = DigitsClassifier()
    losses = train_classifier(
        clf,
        split.train_images,
        split.train_labels,
        recipe["steps"],
        recipe["batch_size"],
        recipe["lr"],
        recipe["weight_decay"],
        recipe["noise_std"],
        recipe["seed"],
        progress,
    )
    acc = classifier_accuracy(clf, split.heldout_images, split.heldout_labels)
    seconds = time.perf_counter() - t0
    info = {
        "recipe": recipe,
        "version": DIGITS_VERSION,
        "net": {"hidden": clf.hidden},
        "parameters": sum(p.numel() for p in clf.parameters()),
        "steps": recipe["steps"],
        "final_train_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "heldout_accuracy": acc,
        "seconds": round(seconds, 2),
    }

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in clf.state_dict().items()}, tmp / "classifier.safetensors"
        )
        (tmp / "classifier_info.json").write_text(json.dumps(info, indent=2) + "\n")

    path = publish_directory(target, "classifier_info.json", write, force)
    say(f"digits classifier: held-out accuracy {acc:.3f} ({seconds:.1f} s) -> {path}")
    return path


@torch.no_grad()
def evaluate_samples(
    net: DigitsVelocityNet,
    classifier: str | os.PathLike,
    n: int = EVAL_SAMPLES,
    steps: int = EVAL_EULER_STEPS,
    seed: int = 0,
) -> dict[str, float]:
    """Sample ``n`` images (labels ``i % 10``, Euler, seeded noise) and score them with the
    classifier in folder ``classifier``: ``class_accuracy`` (argmax = label), ``bold_rate``
    (ink mass above the class median), ``geneval`` and ``pickscore`` (means of the
    :mod:`rlpost.diffusion.rewards` of those names)."""
    from rlpost.diffusion.rewards import DigitsRewardModel, mean_ink

    labels = torch.arange(n) % N_CLASSES
    x = euler_sample(net, labels, steps, generator=torch.Generator().manual_seed(seed))
    images = ((x + 1) / 2).clamp(0, 1)
    model = DigitsRewardModel(classifier)
    return {
        "class_accuracy": model.class_accuracy(images, labels),
        "bold_rate": (mean_ink(images) > class_ink_medians()[labels]).float().mean().item(),
        "geneval": model.geneval(images, labels).mean().item(),
        "pickscore": model.pickscore(images, labels).mean().item(),
    }


@_with_grad
def build_digits_base(
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    *,
    steps: int | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    label_noise: float | None = None,
    hidden: int | None = None,
    n_blocks: int | None = None,
    emb_dim: int | None = None,
    classifier: str | os.PathLike | None = None,
) -> Path:
    """Build (or find in the cache) the pretrained digits flow model.

    Seeded init of a :class:`DigitsVelocityNet`, then :func:`train_flow_matching` on the
    train split (model space). Saves ``velocity.safetensors`` and ``base_info.json``
    (recipe, net config, steps, seconds, held-out flow-matching loss before / after,
    sample metrics of :func:`evaluate_samples`) into :func:`base_path`, atomically.
    The default recipe (1,500 steps with 10% label noise, ~30 s on one core) gives clean
    digits that are the requested class ~85% of the time (see ``label_noise`` in
    :func:`train_flow_matching`): a good but imperfect prompt follower.

    Args:
        cache_dir: cache root (default :func:`default_cache_dir`).
        force: rebuild even if a finished build exists (it is replaced).
        progress: progress bar and summary on stderr.
        steps, seed, batch_size, lr, weight_decay, label_noise, hidden, n_blocks, emb_dim:
            recipe;
            ``None`` takes :data:`BASE_DEFAULTS`. They determine the cache folder.
        classifier: folder of a built classifier for the sample evaluation; default
            the default :func:`build_digits_classifier` in ``cache_dir`` (built if needed).
            It only affects the recorded metrics, not the weights or the folder.

    Returns:
        the build folder (load with :func:`load_digits_net` or :meth:`DigitsPolicy.pretrained`).
    """
    recipe = _merge(
        BASE_DEFAULTS,
        {
            "steps": steps,
            "seed": seed,
            "batch_size": batch_size,
            "lr": lr,
            "weight_decay": weight_decay,
            "label_noise": label_noise,
            "hidden": hidden,
            "n_blocks": n_blocks,
            "emb_dim": emb_dim,
        },
    )
    target = base_path(cache_dir, **recipe)
    if _is_complete(target, "base_info.json") and not force:
        log.info("using cached digits base %s", target)
        return target
    say = _say(progress)
    clf_dir = Path(classifier) if classifier is not None else None
    if clf_dir is None:
        clf_dir = build_digits_classifier(cache_dir, progress=progress)

    t0 = time.perf_counter()
    split = digits_split()
    net_cfg = {k: recipe[k] for k in ("hidden", "n_blocks", "emb_dim")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        net = DigitsVelocityNet(**net_cfg)
    n_params = sum(p.numel() for p in net.parameters())
    say(f"building digits base ({n_params:,} params, {recipe['steps']} steps) -> {target}")
    loss0 = heldout_fm_loss(net)
    losses = train_flow_matching(
        net,
        to_model_space(split.train_images),
        split.train_labels,
        recipe["steps"],
        recipe["batch_size"],
        recipe["lr"],
        recipe["weight_decay"],
        recipe["label_noise"],
        recipe["seed"],
        progress,
    )
    train_seconds = time.perf_counter() - t0
    loss1 = heldout_fm_loss(net)
    metrics = evaluate_samples(net, clf_dir)
    seconds = time.perf_counter() - t0
    info = {
        "recipe": recipe,
        "version": DIGITS_VERSION,
        "net": net.config,
        "parameters": n_params,
        "steps": recipe["steps"],
        "final_train_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "heldout_fm_loss_init": loss0,
        "heldout_fm_loss": loss1,
        "samples": {"n": EVAL_SAMPLES, "euler_steps": EVAL_EULER_STEPS, **metrics},
        "classifier": str(clf_dir),
        "train_seconds": round(train_seconds, 2),
        "seconds": round(seconds, 2),
    }

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in net.state_dict().items()}, tmp / "velocity.safetensors"
        )
        (tmp / "base_info.json").write_text(json.dumps(info, indent=2) + "\n")

    path = publish_directory(target, "base_info.json", write, force)
    say(
        f"digits base: held-out FM loss {loss0:.3f} -> {loss1:.3f}, sample class accuracy "
        f"{metrics['class_accuracy']:.3f}, geneval {metrics['geneval']:.3f} "
        f"({seconds:.1f} s) -> {path}"
    )
    return path


# ----------------------------------------------------------------------------- policy


class DigitsPolicy:
    """:class:`~rlpost.diffusion.models.base.FlowPolicy` over a :class:`DigitsVelocityNet`.

    ``sample_shape = (1, 8, 8)`` (model space, [-1, 1]); prompts are digits (ints 0-9 or
    strings ``"0"``-``"9"``), conditioning ``{"labels": LongTensor [B]}``; ``decode`` maps
    to images in [0, 1]. The reference is a frozen deep copy of ``net`` taken at
    construction unless given.
    """

    sample_shape: tuple[int, ...] = (1, 8, 8)

    def __init__(self, net: DigitsVelocityNet, reference: DigitsVelocityNet | None = None):
        self.net = net
        self.reference = copy.deepcopy(net) if reference is None else reference
        self.reference.requires_grad_(False)
        self.reference.eval()

    @classmethod
    def pretrained(
        cls, cache_dir: str | os.PathLike | None = None, progress: bool = True
    ) -> DigitsPolicy:
        """The default cached base (built on first use, see :func:`build_digits_base`)."""
        return cls(load_digits_net(build_digits_base(cache_dir, progress=progress)))

    @classmethod
    def random(cls, seed: int = 0, **net_kwargs: Any) -> DigitsPolicy:
        """An untrained net (zero output layer, so ``v = 0``), no cache; for tests."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = DigitsVelocityNet(**net_kwargs)
        return cls(net)

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    def to(self, device: torch.device | str) -> DigitsPolicy:
        """Move both nets to ``device``; returns ``self``."""
        self.net.to(device)
        self.reference.to(device)
        return self

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        return self.net(x, sigma, cond["labels"])

    def reference_velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        with torch.no_grad():
            return self.reference(x, sigma, cond["labels"])

    def encode(self, prompts: Sequence[Any]) -> Cond:
        """``{"labels": [B]}`` on the policy's device; ``ValueError`` on a bad prompt."""
        return {"labels": parse_digit_prompts(prompts).to(self.device)}

    def decode(self, x: Tensor) -> Tensor:
        """Model space -> images ``[B, 1, 8, 8]`` in [0, 1]: ``((x + 1) / 2).clamp(0, 1)``."""
        return ((x + 1) / 2).clamp(0, 1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.net.parameters() if p.requires_grad]

    def trainable_module(self) -> nn.Module:
        return self.net
