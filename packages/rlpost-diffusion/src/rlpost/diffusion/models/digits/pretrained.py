"""The pretrained digits flow model: its cached build and the sample metrics recorded with it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from rlpost.core.io.cache import publish_directory
from rlpost.diffusion.models.digits._build import DIGITS_VERSION, hashed_path, is_complete, log
from rlpost.diffusion.models.digits._build import merge as _merge
from rlpost.diffusion.models.digits._build import say as _say
from rlpost.diffusion.models.digits._build import with_grad as _with_grad
from rlpost.diffusion.models.digits.classifier import build_digits_classifier
from rlpost.diffusion.models.digits.data import (
    N_CLASSES,
    class_ink_medians,
    digits_split,
    mean_ink,
    to_model_space,
)
from rlpost.diffusion.models.digits.nets import (
    DigitsVelocityNet,
    euler_sample,
    heldout_fm_loss,
    train_flow_matching,
)

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


#: Samples (balanced over the classes) and Euler steps of the builder's sample evaluation.
EVAL_SAMPLES = 512
EVAL_EULER_STEPS = 20


def base_path(cache_dir: str | os.PathLike | None = None, **params: Any) -> Path:
    """Where :func:`build_digits_base` with these parameters stores its build:
    ``<cache>/diffusion/digits-<hash of the recipe>``."""
    return hashed_path(cache_dir, "digits", _merge(BASE_DEFAULTS, params))


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
    from rlpost.diffusion.rewards import DigitsRewardModel  # lazy: rewards builds on data

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
    if is_complete(target, "base_info.json") and not force:
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
