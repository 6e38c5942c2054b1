"""Rewards of the digits domain: the classifier and the GenEval / PickScore / hackable rewards."""

import json
import os

import pytest
import torch

import rlpost.diffusion.models.digits as digits
import rlpost.diffusion.rewards as rewards
from rlpost.diffusion.models.digits import build_digits_classifier, digits_split
from rlpost.diffusion.rewards import (
    REWARDS,
    DigitsRewardModel,
    RewardFn,
    hackable,
    make_reward,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    torch.set_num_threads(1)
    path = build_digits_classifier(tmp_path_factory.mktemp("cache"), progress=False, steps=150)
    return DigitsRewardModel(path)


@pytest.fixture(scope="session")
def heldout():
    s = digits_split()
    return s.heldout_images, s.heldout_labels.tolist()


def _wrong(labels: list[int]) -> list[int]:
    return [(y + 1 + i % 9) % 10 for i, y in enumerate(labels)]


def test_classifier_beats_chance_on_heldout(model, heldout):
    images, labels = heldout
    info = json.loads((model.path / "classifier_info.json").read_text())
    assert info["heldout_accuracy"] > 0.8  # chance is 0.1
    assert model.class_accuracy(images, labels) == pytest.approx(info["heldout_accuracy"])
    assert model.logits(images).shape == (len(labels), 10)
    assert model.class_accuracy(images, _wrong(labels)) < 0.1


def test_geneval_is_binary_and_needs_class_and_boldness(model, heldout):
    images, labels = heldout
    r = model.geneval(images, labels)
    assert r.shape == (len(labels),) and r.dtype == torch.float32
    assert set(r.unique().tolist()) <= {0.0, 1.0}
    # bold = above the class median of real images: roughly half of real digits qualify
    assert 0.2 < r.mean().item() < 0.8
    assert (r <= model.correct(images, labels).float()).all()
    assert model.geneval(images, _wrong(labels)).mean() < 0.1
    noise = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert set(model.geneval(noise, [i % 10 for i in range(64)]).unique().tolist()) <= {0, 1}
    # thinning a digit (less ink) can only lose the bold property
    thin = model.geneval(images * 0.5, labels)
    assert thin.sum() < r.sum()


def test_pickscore_prefers_the_prompted_class(model, heldout):
    images, labels = heldout
    right = model.pickscore(images, labels)
    wrong = model.pickscore(images, _wrong(labels))
    assert right.shape == wrong.shape == (len(labels),)
    assert right.mean() > wrong.mean()
    assert (right > wrong).float().mean() > 0.9
    assert ((right > 0) == model.correct(images, labels)).all()  # margin > 0 iff recognised


def test_pickscore_and_hackable_are_differentiable(model, heldout):
    images = heldout[0][:8].clone().requires_grad_(True)
    (model.pickscore(images, list(range(8))).sum() + hackable(images, [0] * 8).sum()).backward()
    assert images.grad is not None and images.grad.abs().sum() > 0


def test_hackable_is_maximised_by_a_saturated_image_that_is_no_digit(model, heldout):
    images, labels = heldout
    white = torch.ones(len(labels), 1, 8, 8)
    assert hackable(white, labels).eq(1.0).all()
    assert (hackable(images, labels) < 1.0).all()
    assert model.hackable(images, labels).equal(hackable(images, labels))
    # one constant image gets one class: at most ~1/10 of balanced prompts are "recognised"
    balanced = [i % 10 for i in range(len(labels))]
    assert model.class_accuracy(white, balanced) <= 0.11
    assert model.class_accuracy(white, balanced) < model.class_accuracy(images, labels)
    assert model.geneval(white, balanced).mean() <= 0.11


def test_inputs_are_validated_and_channels_averaged(model, heldout):
    images, labels = heldout[0][:4], heldout[1][:4]
    rgb = images.expand(-1, 3, -1, -1)
    assert torch.allclose(model.pickscore(rgb, labels), model.pickscore(images, labels))
    assert model.pickscore(images, [str(y) for y in labels]).equal(model.pickscore(images, labels))
    with pytest.raises(ValueError, match="invalid digit prompt 'cat' at index 2"):
        model.geneval(images, [0, 1, "cat", 3])
    with pytest.raises(ValueError, match="4 images but 3 prompts"):
        model.pickscore(images, labels[:3])
    with pytest.raises(ValueError, match=r"\[B, C, 8, 8\]"):
        model.pickscore(torch.rand(4, 1, 16, 16), labels)


def test_make_reward_rejects_unknown_names_listing_valid_ones():
    with pytest.raises(ValueError, match="unknown reward 'aesthetic'") as err:
        make_reward("aesthetic")
    for name in ("geneval", "pickscore", "hackable"):
        assert name in str(err.value)
    assert set(REWARDS) == {"geneval", "pickscore", "hackable"}


def test_make_reward_builds_the_default_classifier_once(tmp_path, monkeypatch, heldout):
    monkeypatch.setitem(digits.CLASSIFIER_DEFAULTS, "steps", 10)
    hack = make_reward("hackable", tmp_path)
    assert hack is hackable and isinstance(hack, RewardFn)
    assert not (tmp_path / "diffusion").exists()  # no classifier needed for it
    gen, pick = make_reward("geneval", tmp_path), make_reward("pickscore", tmp_path)
    assert isinstance(gen, RewardFn) and gen.__self__ is pick.__self__  # shared model
    images, labels = heldout[0][:10], heldout[1][:10]
    with torch.inference_mode():  # the lazy first build must still be able to train
        assert set(gen(images, labels).tolist()) <= {0.0, 1.0}
    assert pick(images, labels).shape == (10,)
    grad_images = images.clone().requires_grad_(True)
    pick(grad_images, labels).sum().backward()  # loaded in inference mode, still usable
    assert grad_images.grad is not None
    assert len(list((tmp_path / "diffusion").iterdir())) == 1
    acc = rewards.class_accuracy(images, labels, cache_dir=tmp_path)
    assert 0.0 <= acc <= 1.0
    monkeypatch.setenv("RLPOST_CACHE", os.fspath(tmp_path))  # module-level defaults
    assert rewards.pickscore(images, labels).equal(pick(images, labels))
    assert rewards.geneval(images, labels).equal(gen(images, labels))


def test_load_reward_by_name_or_import_path(tmp_path):
    assert rewards.load_reward("hackable") is hackable
    assert rewards.load_reward("rlpost.diffusion.rewards:mean_ink") is rewards.mean_ink
    with pytest.raises(ValueError, match="valid rewards"):
        rewards.load_reward("nope")
    with pytest.raises(ValueError, match=r"reward.name: module .rlpost.diffusion.rewards. has no"):
        rewards.load_reward("rlpost.diffusion.rewards:nope")


def test_quality_metrics_are_per_sample(tmp_path, monkeypatch, heldout):
    monkeypatch.setitem(digits.CLASSIFIER_DEFAULTS, "steps", 10)
    assert rewards.quality_metrics("sd3") == {}
    metrics = rewards.quality_metrics("digits", tmp_path)
    assert {"class_accuracy", "geneval", "pickscore", "ink"} <= set(metrics)
    images, labels = heldout[0][:10], heldout[1][:10]
    for fn in metrics.values():
        assert fn(images, labels).shape == (10,)
    acc = metrics["class_accuracy"](images, labels)
    assert acc.mean().item() == pytest.approx(rewards.class_accuracy(images, labels, tmp_path))
