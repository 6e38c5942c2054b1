"""The fleet's experience store: append-only, crash-safe, readable by lerobot.

Layout of a store folder::

    spool/ep-00000000.safetensors ...   one whole episode per file (the record)
    current -> views/v000007            a finalised LeRobotDataset of the spool's episodes
    views/v000007/                      (meta/info.json, data/chunk-*/file-*.parquet, ...)
    quarantine/                         files recovery moved aside (never deleted)

**Recording.** :meth:`ExperienceStore.append` writes an episode to a temporary file,
``fsync`` s it and renames it into place (then ``fsync`` s the folder): a kill at any
instant leaves the episode wholly recorded or not at all. Episode ``i`` of the store is
``spool/ep-<i>.safetensors`` and episode ``i`` of the LeRobotDataset.

**The LeRobotDataset.** lerobot's writer keeps its parquet files open (no footer) until
``finalize()`` and rewrites ``meta/*.json`` in place, so a dataset written to while the
process dies cannot be opened again. :meth:`build_view` therefore never writes to the
dataset readers see: it clones ``current`` (hard links for the immutable parquet files,
copies of ``meta/``'s top-level files, which lerobot rewrites), appends the spool's new
episodes with ``LeRobotDataset.resume`` and ``finalize()``, ``fsync`` s the clone and
switches the ``current`` link atomically. Readers open ``LeRobotDataset(repo_id,
root=<store>/current)``, or :func:`rlpost.robot.lerobot_data.load_lerobot_dataset`.

**Recovery** (:meth:`ExperienceStore.open`, every start): leftovers of interrupted writes
are removed (a half-written episode, a half-built view); the spool is checked file by
file (the safetensors header and length) and cut at the first file that is not whole:
that file and any after it go to ``quarantine/``, so the store ends at its last whole
episode; a ``current`` view that does not open (a truncated parquet or JSON file) is
marked so that the next :meth:`ExperienceStore.build_view` rebuilds it from the spool.
:class:`Recovery` says what was done, in one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ExperienceStore", "Recovery"]

_EPISODE = re.compile(r"ep-(\d{8})\.safetensors$")
_ARRAYS = ("obs", "actions", "rewards", "step_success", "intervention")
_OPTIONAL = ("contact_force",)  # contact tasks' per-step force


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(folder))


@contextlib.contextmanager
def _no_image_embedding() -> Iterator[None]:
    """lerobot 0.6's ``save_episode`` runs ``embed_images`` (a per-row ``datasets.map``)
    on every episode, images or not: 70 % of the time of an episode of our state-only
    features. Without image features it is the identity, so it is skipped here."""
    try:
        from lerobot.datasets import dataset_writer
    except ImportError:  # another lerobot layout: leave it alone
        yield
        return
    embed = getattr(dataset_writer, "embed_images", None)
    if embed is None:
        yield
        return
    dataset_writer.embed_images = lambda ds: ds
    try:
        yield
    finally:
        dataset_writer.embed_images = embed


@dataclass
class Recovery:
    """What :meth:`ExperienceStore.open` found and did."""

    episodes: int = 0
    partial_writes: int = 0
    """Half-written episode files removed (the process died while writing them)."""
    quarantined: list[str] = field(default_factory=list)
    """Spool files moved to ``quarantine/``: the first damaged one and all after it."""
    damage: str | None = None
    view: str = "ok"
    """``ok``, ``new`` (no view yet), or why the view was rebuilt."""

    @property
    def clean(self) -> bool:
        return not (self.partial_writes or self.quarantined) and self.view in ("ok", "new")

    def __str__(self) -> str:
        if self.clean:
            return f"store: {self.episodes} episodes"
        parts = []
        if self.partial_writes:
            parts.append(f"removed {self.partial_writes} partially written episode(s)")
        if self.quarantined:
            parts.append(
                f"{self.damage}; moved it and the {len(self.quarantined) - 1} after it to "
                "quarantine/"
            )
        if self.view not in ("ok", "new"):
            parts.append(f"the LeRobotDataset view {self.view}: it is rebuilt from the spool")
        last = self.episodes - 1
        return f"store: recovered to its last whole episode ({last}; {self.episodes} in all): " + (
            "; ".join(parts)
        )


class ExperienceStore:
    """A fleet's episodes of one task (see the module docstring). Open with
    :meth:`open` (recovers and creates as needed) or :meth:`open_read` (no changes)."""

    def __init__(self, root: Path, task: str, fps: float, robot_type: str):
        self.root, self.task, self.fps, self.robot_type = root, task, fps, robot_type
        self.spool = root / "spool"
        self.views = root / "views"
        self.current = root / "current"
        self._n = sum(1 for p in self.spool.iterdir() if _EPISODE.match(p.name))
        self.view_ok = True  # False: the next build_view starts from scratch

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, root: str | os.PathLike, task: str) -> tuple[ExperienceStore, Recovery]:
        """The store at ``root`` for ``task`` (created when missing), after recovery."""
        from rlpost.robot.envs import TASKS

        root = Path(root)
        meta = root / "store.json"
        if meta.is_file():
            found = json.loads(meta.read_text()).get("task")
            if found != task:
                raise ValueError(f"store {root} holds {found!r} episodes, not {task!r}")
        else:
            root.mkdir(parents=True, exist_ok=True)
            tmp = meta.with_name(f"store.json.tmp-{os.getpid()}")
            tmp.write_text(json.dumps({"task": task, "format": 1}))
            os.replace(tmp, meta)
        for sub in ("spool", "views"):
            (root / sub).mkdir(exist_ok=True)
        rec = cls._recover_spool(root)
        store = cls(root, task, TASKS[task].fps, task)
        rec.episodes = len(store)
        rec.view = store._check_view()
        store.view_ok = rec.view in ("ok", "new")
        return store, rec

    @classmethod
    def open_read(cls, root: str | os.PathLike) -> ExperienceStore:
        """The store at ``root`` as it is, for reading (no recovery, no writes)."""
        from rlpost.robot.envs import TASKS

        root = Path(root)
        task = json.loads((root / "store.json").read_text())["task"]
        return cls(root, task, TASKS[task].fps, task)

    @staticmethod
    def _recover_spool(root: Path) -> Recovery:
        from rlpost.core.io.checkpoint import safetensors_problem

        rec = Recovery()
        spool, quarantine = root / "spool", root / "quarantine"
        for f in spool.iterdir():
            if ".tmp-" in f.name:
                f.unlink()
                rec.partial_writes += 1
        for v in (root / "views").iterdir():  # half-built views (current is re-linked below)
            if ".tmp-" in v.name:
                shutil.rmtree(v, ignore_errors=True)
        for link in root.glob("current.tmp-*"):  # a link made but never switched in
            link.unlink()
        files = sorted(
            (int(m.group(1)), p) for p in spool.iterdir() if (m := _EPISODE.match(p.name))
        )
        cut = None
        for expected, (i, p) in enumerate(files):
            if i != expected:
                cut, rec.damage = expected, f"episode {expected} is missing"
                break
            problem = safetensors_problem(p)
            if problem is not None:
                cut, rec.damage = expected, f"episode {expected} is damaged ({problem})"
                break
        if cut is not None:
            quarantine.mkdir(exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for i, p in files:
                if i >= cut:
                    os.replace(p, quarantine / f"{stamp}-{p.name}")
                    rec.quarantined.append(p.name)
            _fsync_dir(spool)
        return rec

    # ------------------------------------------------------------------ recording
    def __len__(self) -> int:
        return self._n

    def path(self, index: int) -> Path:
        return self.spool / f"ep-{index:08d}.safetensors"

    def append(self, ep: Any) -> int:
        """Record episode ``ep`` (an :class:`rlpost.robot.demos.Episode`) atomically;
        returns its index in the store."""
        from safetensors.numpy import save_file

        i = self._n
        t = len(ep.actions)
        arrays = {
            "obs": np.asarray(ep.obs, dtype=np.float32),
            "actions": np.asarray(ep.actions, dtype=np.float32),
            "rewards": np.asarray(ep.rewards, dtype=np.float32),
            "step_success": np.asarray(
                ep.step_success if ep.step_success is not None else np.zeros(t), dtype=bool
            ),
            "intervention": np.asarray(
                ep.intervention if ep.intervention is not None else np.zeros(t), dtype=bool
            ),
        }
        if ep.contact_force is not None:
            arrays["contact_force"] = np.asarray(ep.contact_force, dtype=np.float32)
        meta = {
            "success": bool(ep.success),
            "terminated": bool(ep.terminated),
            "policy_version": int(ep.policy_version),
            "robot": int(ep.robot),
            "episode_id": int(ep.episode_id),
            "seed": None if ep.seed is None else int(ep.seed),
            "metrics": ep.metrics,
        }
        final = self.path(i)
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        save_file(arrays, str(tmp), metadata={"episode": json.dumps(meta)})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.spool)
        self._n = i + 1
        return i

    def truncate(self, n: int) -> int:
        """Forget every episode from index ``n`` on (a run resumed from a checkpoint
        records them again); the view is rebuilt when it holds any of them. Returns how
        many were removed."""
        if not 0 <= n <= self._n:
            raise ValueError(f"store {self.root} has {self._n} episodes, cannot keep {n}")
        removed = self._n - n
        for i in reversed(range(n, self._n)):
            self.path(i).unlink()
        if removed:
            _fsync_dir(self.spool)
        self._n = n
        if self.view_episodes() > n:
            self.view_ok = False
        return removed

    def read(self, indices: Sequence[int] | None = None) -> list[Any]:
        """Episodes ``indices`` (default: all) as :class:`rlpost.robot.demos.Episode` s."""
        from safetensors import safe_open

        from rlpost.robot.demos import Episode

        out = []
        for i in range(self._n) if indices is None else indices:
            if not 0 <= i < self._n:
                raise IndexError(f"store {self.root} has {self._n} episodes, no episode {i}")
            with safe_open(str(self.path(i)), framework="np") as f:
                stored = set(f.keys())
                a = {k: f.get_tensor(k) for k in (*_ARRAYS, *_OPTIONAL) if k in stored}
                meta = json.loads(f.metadata()["episode"])
            out.append(
                Episode(
                    obs=a["obs"], actions=a["actions"], rewards=a["rewards"],
                    success=meta["success"], metrics=meta["metrics"],
                    terminated=meta["terminated"], step_success=a["step_success"],
                    task=self.task, seed=meta["seed"], intervention=a["intervention"],
                    policy_version=meta["policy_version"], robot=meta["robot"],
                    episode_id=meta["episode_id"], contact_force=a.get("contact_force"),
                )
            )  # fmt: skip
        return out

    def episode_ids(self) -> list[int]:
        """The fleet episode id of every stored episode, in store order."""
        from safetensors import safe_open

        ids = []
        for i in range(self._n):
            with safe_open(str(self.path(i)), framework="np") as f:
                ids.append(json.loads(f.metadata()["episode"])["episode_id"])
        return ids

    # ------------------------------------------------------------------ the view
    @property
    def repo_id(self) -> str:
        return f"local/{self.root.name}"

    def view_episodes(self) -> int:
        """Episodes in the ``current`` LeRobotDataset (0 without one)."""
        info = self.current / "meta" / "info.json"
        return json.loads(info.read_text())["total_episodes"] if info.is_file() else 0

    def _check_view(self) -> str:
        if not self.current.exists():
            for v in self.views.iterdir():  # views never switched in
                shutil.rmtree(v, ignore_errors=True)
            return "new" if len(self) == 0 else "is missing"
        live = self.current.resolve()
        for v in self.views.iterdir():
            if v.resolve() != live:
                shutil.rmtree(v, ignore_errors=True)
        try:
            from rlpost.robot.lerobot_data import open_lerobot_dataset

            ds = open_lerobot_dataset(self.current, self.repo_id)
            n = ds.meta.total_episodes
            del ds
        except Exception as exc:  # any damage: truncated parquet, garbled JSON, ...
            return f"did not open ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        if n > len(self):
            return f"holds {n} episodes, more than the spool's {len(self)}"
        return "ok"

    def build_view(self, rebuild: bool = False) -> int:
        """Bring the ``current`` LeRobotDataset up to the spool (see the module docstring);
        ``rebuild`` (or a view :meth:`open` found damaged): from scratch. Returns the
        number of episodes added."""
        from rlpost.robot.lerobot_data import (
            _lerobot_dataset_cls,
            add_lerobot_episode,
            lerobot_features,
        )

        lerobot_dataset = _lerobot_dataset_cls()
        rebuild = rebuild or not self.view_ok
        have = 0 if rebuild else self.view_episodes()
        n = len(self)
        if have >= n and not rebuild:
            return 0
        gens = [int(v.name[1:]) for v in self.views.iterdir() if re.fullmatch(r"v\d{6}", v.name)]
        new = self.views / f"v{max(gens, default=-1) + 1:06d}"
        tmp = new.with_name(new.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        if have == 0:
            ds = lerobot_dataset.create(
                repo_id=self.repo_id, fps=round(self.fps), root=tmp, robot_type=self.robot_type,
                features=lerobot_features(self.task, fleet=True), use_videos=False,
                video_backend="pyav",
            )  # fmt: skip
        else:
            old = self.current.resolve()
            for folder, _, files in os.walk(old):
                rel = Path(folder).relative_to(old)
                (tmp / rel).mkdir(parents=True, exist_ok=True)
                for f in files:  # lerobot rewrites meta/*.json and tasks.parquet in place
                    link = os.link if rel != Path("meta") else shutil.copy2
                    link(Path(folder) / f, tmp / rel / f)
            ds = lerobot_dataset.resume(self.repo_id, root=tmp, video_backend="pyav")
        with _no_image_embedding():
            for ep in self.read(range(have, n)):
                add_lerobot_episode(ds, ep, self.task, fleet=True)
        ds.finalize()
        del ds
        _fsync_tree(tmp)
        os.replace(tmp, new)
        link = self.root / f"current.tmp-{os.getpid()}"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(os.path.relpath(new, self.root), link)
        os.replace(link, self.current)
        _fsync_dir(self.root)
        for v in self.views.iterdir():
            if v != new:
                shutil.rmtree(v, ignore_errors=True)
        self.view_ok = True
        return n - have
