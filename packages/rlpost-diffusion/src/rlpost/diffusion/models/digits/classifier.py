"""The reward / evaluation classifier of the digits domain and its cached build."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from rlpost.core.io.cache import publish_directory
from rlpost.diffusion.models.digits._build import DIGITS_VERSION, hashed_path, is_complete, log
from rlpost.diffusion.models.digits._build import merge as _merge
from rlpost.diffusion.models.digits._build import say as _say
from rlpost.diffusion.models.digits._build import warmup_cosine as _warmup_cosine
from rlpost.diffusion.models.digits._build import with_grad as _with_grad
from rlpost.diffusion.models.digits.data import N_CLASSES, N_PIXELS, digits_split

#: Defaults of :func:`build_digits_classifier`.
CLASSIFIER_DEFAULTS: dict[str, Any] = {
    "steps": 1000,
    "batch_size": 128,
    "lr": 2e-3,
    "weight_decay": 0.01,
    "noise_std": 0.15,
    "seed": 0,
}


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
    ``classifier.safetensors`` file), in eval mode on CPU with gradients disabled. Loading
    leaves torch's global generator untouched (it is built lazily, mid-run, and a resumed
    run must draw the same numbers as an uninterrupted one)."""
    from safetensors.torch import load_file

    file = Path(path)
    if file.is_dir():
        file = file / "classifier.safetensors"
    info = json.loads((file.parent / "classifier_info.json").read_text())
    with torch.random.fork_rng(devices=[]):  # the init is overwritten: draw nothing global
        clf = DigitsClassifier(**info["net"])
    clf.load_state_dict(load_file(file))
    clf.requires_grad_(False)
    return clf.eval()


def classifier_path(cache_dir: str | os.PathLike | None = None, **params: Any) -> Path:
    """Where :func:`build_digits_classifier` stores its build:
    ``<cache>/diffusion/digits-classifier-<hash of the recipe>``."""
    return hashed_path(cache_dir, "digits-classifier", _merge(CLASSIFIER_DEFAULTS, params))


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
    if is_complete(target, "classifier_info.json") and not force:
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
