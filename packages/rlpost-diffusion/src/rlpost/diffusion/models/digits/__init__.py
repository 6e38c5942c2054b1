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

Modules: ``data`` (the split, prompts, model space), ``nets`` (velocity net,
pretraining, Euler sampler), ``classifier`` (the reward classifier and its build),
``pretrained`` (the base build and its sample metrics), ``policy`` (:class:`DigitsPolicy`).

Typical use::

    policy = DigitsPolicy.pretrained()     # ~40 s on one CPU core the first time, cached
    cond = policy.encode([3, 3, 7])
"""

from rlpost.core.io.cache import default_cache_dir
from rlpost.diffusion.models.digits._build import DIGITS_VERSION
from rlpost.diffusion.models.digits.classifier import (
    CLASSIFIER_DEFAULTS,
    DigitsClassifier,
    build_digits_classifier,
    classifier_accuracy,
    classifier_path,
    load_digits_classifier,
    train_classifier,
)
from rlpost.diffusion.models.digits.data import (
    N_CLASSES,
    N_PIXELS,
    DigitsSplit,
    class_ink_medians,
    digits_split,
    mean_ink,
    parse_digit_prompts,
    to_model_space,
)
from rlpost.diffusion.models.digits.nets import (
    DigitsVelocityNet,
    euler_sample,
    flow_matching_loss,
    heldout_fm_loss,
    load_digits_net,
    sinusoidal_embedding,
    train_flow_matching,
)
from rlpost.diffusion.models.digits.policy import DigitsPolicy
from rlpost.diffusion.models.digits.pretrained import (
    BASE_DEFAULTS,
    EVAL_EULER_STEPS,
    EVAL_SAMPLES,
    base_path,
    build_digits_base,
    evaluate_samples,
)

__all__ = [
    "BASE_DEFAULTS",
    "CLASSIFIER_DEFAULTS",
    "DIGITS_VERSION",
    "EVAL_EULER_STEPS",
    "EVAL_SAMPLES",
    "N_CLASSES",
    "N_PIXELS",
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
    "mean_ink",
    "parse_digit_prompts",
    "sinusoidal_embedding",
    "to_model_space",
    "train_classifier",
    "train_flow_matching",
]
