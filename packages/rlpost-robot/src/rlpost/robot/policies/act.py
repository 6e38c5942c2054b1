"""lerobot's Action Chunking Transformer (ACT) behind our chunk-policy interface.

``ActChunkPolicy`` wraps ``lerobot.policies.act.ACTPolicy`` (lerobot extra) so that the
rest of the domain (``ChunkController``, ``evaluate_policy``, PAC-ACT) uses it like
:class:`~rlpost.robot.policies.flow.FlowChunkPolicy`: ``sample(obs [B, D]) -> [B, H, A]``.
The flat observation vector is split into lerobot's ``observation.state`` and
``observation.environment_state`` by the task's ``TaskSpec.env_obs`` (a state-only ACT
needs the environment state: lerobot rejects a config without images or it).
Normalisation runs through lerobot's own pre / post processor pipelines
(``make_pre_post_processors``) with mean / std statistics of the demonstrations, the
environment state included.

A lerobot ACT checkpoint (the ``pretrained_model/`` folder ``lerobot-train`` writes:
``config.json``, ``model.safetensors`` and the ``policy_preprocessor`` /
``policy_postprocessor`` pipelines with their statistics) is fine-tuned through
:meth:`ActChunkPolicy.from_lerobot`, and every saved policy carries such a folder,
``lerobot/``, so a fine-tuned ACT loads back with ``ACTPolicy.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlpost.robot.policies._io import read_policy, save_policy


def _lerobot():
    try:
        from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy
        from lerobot.policies.factory import make_pre_post_processors
    except ImportError as exc:  # pragma: no cover - the dev environment has lerobot
        from rlpost.core import MissingDependency

        raise MissingDependency("ACT needs lerobot: pip install 'rlpost-robot[lerobot]'") from exc
    return (
        FeatureType,
        NormalizationMode,
        PolicyFeature,
        ACTConfig,
        ACTPolicy,
        make_pre_post_processors,
    )


def _stats(x: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "mean": x.mean(0).astype(np.float32),
        "std": np.maximum(x.std(0), 1e-3).astype(np.float32),
        "min": x.min(0).astype(np.float32),
        "max": x.max(0).astype(np.float32),
    }


class ActChunkPolicy(nn.Module):
    """An ``ACTPolicy`` with our ``sample`` / ``cfg.horizon`` interface.

    ``env_idx``: indices of the observation vector that are the environment state.
    ``stats``: lerobot-format statistics (``{"observation.state": {"mean": ..., ...}, ...}``).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        env_idx: tuple[int, ...],
        horizon: int = 8,
        stats: dict[str, dict[str, np.ndarray]] | None = None,
        dim_model: int = 64,
        n_layers: int = 1,
        use_vae: bool = True,
        state_idx: tuple[int, ...] | None = None,
    ):
        super().__init__()
        self.init_kwargs = {
            "obs_dim": obs_dim,
            "act_dim": act_dim,
            "env_idx": list(env_idx),
            "horizon": horizon,
            "dim_model": dim_model,
            "n_layers": n_layers,
            "use_vae": use_vae,
        }
        if state_idx is not None:
            self.init_kwargs["state_idx"] = list(state_idx)
        FeatureType, NormalizationMode, PolicyFeature, ACTConfig, ACTPolicy, make_pp = _lerobot()
        if not env_idx:
            raise ValueError("a state-only ACT needs at least one environment-state entry")
        if state_idx is None:
            state_idx = tuple(i for i in range(obs_dim) if i not in set(env_idx))
        config = ACTConfig(
            input_features={
                "observation.state": PolicyFeature(FeatureType.STATE, (len(state_idx),)),
                "observation.environment_state": PolicyFeature(FeatureType.ENV, (len(env_idx),)),
            },
            output_features={"action": PolicyFeature(FeatureType.ACTION, (act_dim,))},
            chunk_size=horizon,
            n_action_steps=horizon,
            dim_model=dim_model,
            n_heads=4,
            dim_feedforward=2 * dim_model,
            n_encoder_layers=n_layers,
            n_decoder_layers=n_layers,
            n_vae_encoder_layers=n_layers,
            latent_dim=16,
            use_vae=use_vae,
            device="cpu",
            push_to_hub=False,
            pretrained_backbone_weights=None,
            normalization_mapping={
                "STATE": NormalizationMode.MEAN_STD,
                "ENV": NormalizationMode.MEAN_STD,
                "ACTION": NormalizationMode.MEAN_STD,
                "VISUAL": NormalizationMode.MEAN_STD,
            },
        )
        self._setup(ACTPolicy(config), *make_pp(config, dataset_stats=stats), stats,
                    tuple(state_idx), tuple(env_idx), obs_dim, act_dim, horizon)  # fmt: skip

    def _setup(self, act, pre, post, stats, state_idx, env_idx, obs_dim, act_dim, horizon):
        self.act, self.pre, self.post, self.stats = act, pre, post, stats
        self.state_idx, self.env_idx = tuple(state_idx), tuple(env_idx)
        self.cfg = _Cfg(obs_dim, act_dim, horizon)
        a = (stats or {}).get("action", {})
        self.register_buffer("act_mean", torch.as_tensor(a.get("mean", np.zeros(act_dim))).float())
        self.register_buffer("act_std", torch.as_tensor(a.get("std", np.ones(act_dim))).float())

    @classmethod
    def from_lerobot(
        cls,
        path: str | Path,
        obs_dim: int,
        act_dim: int,
        state_idx: tuple[int, ...],
        env_idx: tuple[int, ...],
    ) -> ActChunkPolicy:
        """A lerobot ACT checkpoint folder as a chunk policy over our observation vector.

        ``state_idx`` / ``env_idx``: which entries of the vector, in order, are the
        checkpoint's ``observation.state`` / ``observation.environment_state`` (found by
        name from the data set it was trained on). Its weights, architecture and
        normalisation statistics are the checkpoint's (safetensors + JSON; no pickle); a
        checkpoint with camera inputs or shapes other than these is refused.
        """
        FeatureType, _, _, _, ACTPolicy, make_pp = _lerobot()
        path = Path(path)
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"{path}: not a lerobot policy checkpoint (config.json + model.safetensors, "
                "the pretrained_model/ folder lerobot-train writes)"
            )
        act = ACTPolicy.from_pretrained(str(path))
        config = act.config
        if config.type != "act":
            raise ValueError(f"{path}: a {config.type!r} policy, not an ACT one")
        inputs = config.input_features
        cams = [k for k, f in inputs.items() if f.type == FeatureType.VISUAL]
        if cams:
            raise ValueError(f"{path}: camera inputs {cams} are not supported yet (state only)")
        want = {"observation.state": len(state_idx), "observation.environment_state": len(env_idx)}
        got = {k: tuple(f.shape) for k, f in inputs.items()}
        out = tuple(config.output_features["action"].shape)
        if got != {k: (n,) for k, n in want.items()} or out != (act_dim,):
            raise ValueError(
                f"{path}: the checkpoint reads {got} and writes action {out}; the task's data "
                f"maps to {want} and action ({act_dim},)"
            )
        pre, post = make_pp(config, pretrained_path=str(path))
        flat = next(st.state_dict() for st in pre.steps if hasattr(st, "stats"))
        stats: dict[str, dict[str, np.ndarray]] = {}
        for k, v in flat.items():
            key, stat = k.rsplit(".", 1)
            stats.setdefault(key, {})[stat] = v.numpy()
        for key in ("action", *want):
            if key not in stats:
                raise ValueError(f"{path}: its preprocessor has no statistics for {key}")
        pi = cls.__new__(cls)
        nn.Module.__init__(pi)
        pi.init_kwargs = {"obs_dim": obs_dim, "act_dim": act_dim, "env_idx": list(env_idx),
                          "state_idx": list(state_idx), "horizon": config.chunk_size,
                          "lerobot": True}  # fmt: skip
        pi._setup(act, pre, post, stats, state_idx, env_idx, obs_dim, act_dim, config.chunk_size)
        return pi.eval()

    def save_lerobot(self, path_dir: str | Path) -> Path:
        """lerobot's checkpoint layout of this ACT (``ACTPolicy.from_pretrained`` loads it;
        the processors with ``make_pre_post_processors(config, pretrained_path=...)``)."""
        path = Path(path_dir)
        self.act.save_pretrained(path)
        self.pre.save_pretrained(path)
        self.post.save_pretrained(path)
        return path

    @property
    def device(self) -> torch.device:
        return next(self.act.parameters()).device

    # ------------------------------------------------------------------ batches
    def _obs(self, obs: Tensor) -> dict[str, Tensor]:
        return {
            "observation.state": obs[:, list(self.state_idx)],
            "observation.environment_state": obs[:, list(self.env_idx)],
        }

    def loss(
        self, obs: Tensor, chunks: Tensor, mask: Tensor, weights: Tensor | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """ACT's training loss (L1 on the normalised chunk + ``kl_weight`` x the KL of its
        CVAE) on a batch. Without ``weights``, lerobot's own ``ACTPolicy.forward``; with
        per-sample ``weights [B]`` (detached), the same two terms per sample, weighted."""
        batch = self.pre({**self._obs(obs), "action": chunks})
        batch["action_is_pad"] = ~mask.bool()
        if weights is None:
            loss, info = self.act.forward(batch)
            return loss, {k: float(v) for k, v in info.items()}
        a_hat, (mu, log_var) = self.act.model(batch)
        valid = mask.to(a_hat.dtype)[..., None].expand_as(a_hat)
        l1 = ((batch["action"] - a_hat).abs() * valid).sum((1, 2)) / valid.sum((1, 2)).clamp_min(1)
        per = l1
        if mu is not None:
            kld = (-0.5 * (1 + log_var - mu.pow(2) - log_var.exp())).sum(-1)
            per = per + self.act.config.kl_weight * kld
        w = weights.detach().to(per.dtype)
        return (w * per).mean(), {"l1_loss": float(l1.mean().detach())}

    def normalized_obs(self, obs: Tensor) -> dict[str, Tensor]:
        """lerobot's normalised ``observation.state`` / ``observation.environment_state``."""
        return self.pre(self._obs(obs))

    def normalize_actions(self, chunks: Tensor) -> Tensor:
        return (chunks - self.act_mean) / self.act_std

    def mean_chunk(self, obs: Tensor) -> Tensor:
        """ACT's chunk ``[B, H, A]`` in action units, differentiable (zero CVAE latent, no
        dropout, not clipped): the mean of the PAC-ACT actor."""
        self.act.eval()
        out, _ = self.act.model(self.normalized_obs(obs))
        return out * self.act_std + self.act_mean

    @torch.no_grad()
    def sample(self, obs: Tensor, n_steps: int | None = None, **_: Any) -> Tensor:
        """A chunk ``[B, H, A]`` in action units (``n_steps`` is ignored: ACT is one pass)."""
        self.act.eval()
        chunk = self.act.predict_action_chunk(self.normalized_obs(obs))
        return self.post(chunk).clamp(-1, 1)

    # ------------------------------------------------------------------ persistence
    def save(self, path_dir: str | Path) -> Path:
        """``model.safetensors`` (ACT weights) + ``config.json`` (shape and demo statistics),
        and ``lerobot/``: the same ACT in lerobot's checkpoint layout."""
        stats = {
            key: {k: np.asarray(v).tolist() for k, v in d.items()}
            for key, d in (self.stats or {}).items()
        }
        out = save_policy(self, path_dir, {"kind": "act", **self.init_kwargs, "stats": stats})
        self.save_lerobot(out / "lerobot")
        return out

    @classmethod
    def load(cls, path_dir: str | Path) -> ActChunkPolicy:
        """Rebuild from :meth:`save`'s folder (safetensors + JSON only, no pickle); one
        fine-tuned from a lerobot checkpoint takes its architecture from ``lerobot/``."""
        meta, state = read_policy(path_dir, "act")
        stats = {
            key: {k: np.asarray(v, dtype=np.float32) for k, v in d.items()}
            for key, d in meta.pop("stats").items()
        }
        idx = {k: tuple(meta[k]) for k in ("state_idx", "env_idx") if k in meta}
        if meta.pop("lerobot", False):
            pi = cls.from_lerobot(Path(path_dir) / "lerobot", meta["obs_dim"], meta["act_dim"],
                                  idx["state_idx"], idx["env_idx"])  # fmt: skip
        else:
            pi = cls(**{**meta, **idx}, stats=stats or None)
        pi.load_state_dict(state, strict=True)
        return pi.eval()


class _Cfg:
    def __init__(self, obs_dim: int, act_dim: int, horizon: int):
        self.obs_dim, self.act_dim, self.horizon = obs_dim, act_dim, horizon


def act_stats(
    episodes: Any, env_idx: tuple[int, ...], state_idx: tuple[int, ...] | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """lerobot-format mean / std / min / max statistics of demonstration episodes."""
    obs = np.concatenate([np.asarray(e.obs[:-1]) for e in episodes])
    act = np.concatenate([np.asarray(e.actions) for e in episodes])
    if state_idx is None:
        state_idx = tuple(i for i in range(obs.shape[1]) if i not in set(env_idx))
    state_idx = list(state_idx)
    return {
        "observation.state": _stats(obs[:, state_idx]),
        "observation.environment_state": _stats(obs[:, list(env_idx)]),
        "action": _stats(act),
    }


def train_act_bc(
    policy: ActChunkPolicy,
    obs: Tensor,
    chunks: Tensor,
    mask: Tensor,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Behaviour cloning of ACT on ``make_chunks`` arrays; returns the losses."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(policy.act.get_optim_params(), lr=lr, weight_decay=1e-4)
    policy.act.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(obs), (batch_size,), generator=g)
        loss, _ = policy.loss(obs[idx], chunks[idx], mask[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    policy.act.eval()
    return losses
