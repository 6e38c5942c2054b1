"""Features mapped by name: what connects a policy to data sets and robots.

A policy of this domain reads a flat observation vector and writes a flat action vector,
both in its task's order (``TaskSpec.obs_names`` / ``act_names``). Data sets and robots
name their features instead, the way lerobot does: a ``LeRobotDataset`` column
``observation.state`` carries ``names`` such as ``["shoulder_pan.pos", ...]``, and a lerobot
``Robot`` returns ``{"shoulder_pan.pos": 12.5, ..., "front": <H x W x 3 image>}`` from
``get_observation`` and takes ``{"shoulder_pan.pos": ...}`` in ``send_action``.

:class:`FeatureMap` holds, for each entry of the policy's vectors, the name it has on the
other side, so a vector is assembled from a robot's observation dict by name (never by
position) and an action vector is sent as a dict of the robot's names. A name the other
side lacks is an error naming it, before the first step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FEATURES_FILE", "FeatureMap"]

FEATURES_FILE = "features.json"


@dataclass(frozen=True)
class FeatureMap:
    """``observation[i]`` / ``action[j]``: the name of the policy's ``i``-th observation /
    ``j``-th action entry on the robot (or in the data set). ``image``: the camera feature
    (name, ``(H, W, C)``) whose pixels follow the named entries, flattened, on image tasks.
    """

    observation: tuple[str, ...]
    action: tuple[str, ...]
    image: tuple[str, tuple[int, int, int]] | None = None

    @classmethod
    def for_task(cls, task: str) -> FeatureMap:
        """The names a robot running ``task`` speaks (``TaskSpec.obs_names`` / ``act_names``;
        the camera of an image task is the feature ``front``)."""
        from rlpost.robot.envs import TASKS

        spec = TASKS[task]
        if spec.image_shape is None:
            return cls(tuple(spec.obs_names), tuple(spec.act_names))
        n = spec.obs_dim - int(np.prod(spec.image_shape))
        return cls(tuple(spec.obs_names[:n]), tuple(spec.act_names), ("front", spec.image_shape))

    def renamed(self, rename: Mapping[str, str]) -> FeatureMap:
        """The same map with names replaced (``{old: new}``; names not in it stay)."""
        return FeatureMap(
            tuple(rename.get(n, n) for n in self.observation),
            tuple(rename.get(n, n) for n in self.action),
            None if self.image is None else (rename.get(self.image[0], self.image[0]),
                                             self.image[1]),
        )  # fmt: skip

    def in_data(self, names: Mapping[str, Sequence[str]], rename: Mapping[str, str]) -> FeatureMap:
        """This (task) map in a data set's own names: ``names`` are the data set's entry
        names per feature (``observation.*``, ``action``), ``rename`` the run's ``{data
        name: task name}``. Each side is inverted on its own, and the first data name of a
        side wins as the loader locates it, so a task name reached from an observation
        name and from an action name maps back to each."""

        def back(side: Callable[[str], bool]) -> dict[str, str]:
            out: dict[str, str] = {}
            for key, entries in names.items():
                if side(key):
                    for n in entries:
                        out.setdefault(rename.get(n, n), n)
            return out

        obs, act = back(lambda k: k.startswith("observation.")), back(lambda k: k == "action")
        image = self.image
        if image is not None:  # (a camera is a feature, not a named entry)
            image = (next((d for d, t in rename.items() if t == image[0]), image[0]), image[1])
        return FeatureMap(
            tuple(obs.get(n, n) for n in self.observation),
            tuple(act.get(n, n) for n in self.action),
            image,
        )

    # ---------------------------------------------------------------- checks

    def check(self, observation_features: Mapping[str, Any], action_features: Mapping[str, Any],
              who: str = "the robot") -> None:  # fmt: skip
        """Raise ``ValueError`` naming every feature the policy needs that ``who`` lacks."""
        need_obs = list(self.observation) + ([self.image[0]] if self.image else [])
        missing = [n for n in need_obs if n not in observation_features]
        missing_act = [n for n in self.action if n not in action_features]
        problems = []
        if missing:
            have = sorted(observation_features)
            problems.append(f"observation features {missing} (it has {have})")
        if missing_act:
            problems.append(f"action features {missing_act} (it has {sorted(action_features)})")
        if problems:
            raise ValueError(
                f"{who} lacks the policy's " + "; and ".join(problems)
                + "; the policy speaks its training data's names (policy/features.json; "
                "data.rename maps a data set's names onto the task's)"
            )  # fmt: skip
        if self.image is not None:
            shape = observation_features[self.image[0]]
            if isinstance(shape, tuple) and tuple(shape) != tuple(self.image[1]):
                raise ValueError(
                    f"{who}'s camera {self.image[0]!r} is {shape}; the policy reads {self.image[1]}"
                )

    # ---------------------------------------------------------------- conversion

    def observation_vector(self, obs: Mapping[str, Any]) -> np.ndarray:
        """The policy's float32 observation vector from a robot's observation dict."""
        try:
            vec = [float(obs[n]) for n in self.observation]
        except KeyError as exc:
            raise KeyError(f"the observation has no feature {exc.args[0]!r}") from None
        if self.image is None:
            return np.asarray(vec, dtype=np.float32)
        pixels = np.asarray(obs[self.image[0]], dtype=np.float32).reshape(-1)
        return np.concatenate([np.asarray(vec, dtype=np.float32), pixels])

    def action_dict(self, action: Any) -> dict[str, float]:
        """A robot's ``send_action`` dict from the policy's action vector."""
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape[0] != len(self.action):
            raise ValueError(f"action has {a.shape[0]} entries; the map names {len(self.action)}")
        return {n: float(v) for n, v in zip(self.action, a, strict=True)}

    # ---------------------------------------------------------------- files

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"observation": list(self.observation), "action": list(self.action)}
        if self.image is not None:
            d["image"] = {"name": self.image[0], "shape": list(self.image[1])}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FeatureMap:
        image = d.get("image")
        return cls(
            tuple(d["observation"]),
            tuple(d["action"]),
            None if image is None else (image["name"], tuple(image["shape"])),
        )

    def save(self, folder: str | Path) -> Path:
        """Write ``features.json`` into ``folder`` (beside a saved policy)."""
        path = Path(folder) / FEATURES_FILE
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, folder: str | Path, task: str) -> FeatureMap:
        """``folder``'s ``features.json``, or the task's names when it has none."""
        path = Path(folder) / FEATURES_FILE
        if not path.is_file():
            return cls.for_task(task)
        return cls.from_json(json.loads(path.read_text()))
