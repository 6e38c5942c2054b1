"""SAR (004-19) on run checkpoints: ``rlpost-llm sar``.

Each expert is a run directory (its latest checkpoint) or a ``checkpoints/step-XXXXXX``
folder; the base is the first expert's run's initial weights (its ``config.yaml``'s
``model.path``). Every matrix's update keeps only its part in the base's top singular
subspace (:func:`rlpost.core.spectral.rewire`: ``rank`` or ``energy``); several experts'
cores are added to the base (weights ``lam``). The result is a checkpoint folder that
loads with ``AutoModelForCausalLM.from_pretrained`` (and ``rlpost-llm eval
--checkpoint``), and ``sar.json`` reports, per expert, the retained share of parameters
(the cores' numbers over the model's) and of the update's squared norm.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.core.spectral import Rewired, merge, rewire
from rlpost.llm.tools.weights import checkpoint_of, matching, run_base, save_folder


def sar(
    sources: list[str | Path],
    out: str | Path,
    rank: int | None = None,
    energy: float | None = None,
    keep_vectors: bool = True,
    lam: list[float] | None = None,
) -> dict:
    """The base plus each expert's spectral core, written to ``out``; returns the report.
    Neither ``rank`` nor ``energy``: the whole updates added (task arithmetic)."""
    from safetensors.torch import load_file

    _, model, tok = run_base(checkpoint_of(sources[0])[0], "sar")
    base = model.state_dict()
    cores, report = [], {"rank": rank, "energy": energy, "experts": []}
    for src in sources:
        _, ckpt = checkpoint_of(src)
        state = load_file(str(ckpt / "model.safetensors"))
        matching(base, state, str(ckpt))
        core, params, kept, norm, total = {}, 0, 0, 0.0, 0.0
        for k, w in state.items():
            if not w.is_floating_point():
                continue
            delta = (w - base[k]).float()
            if rank is None and energy is None:  # no rewiring: the whole update (task arithmetic)
                r = Rewired(delta, 0, delta.numel(), delta.numel(), 1.0)
            else:
                r = rewire(base[k].float(), delta, rank, energy, keep_vectors)
            core[k] = r.delta.to(base[k].dtype)
            d2 = float(((w - base[k]).double() ** 2).sum())
            params, kept = params + r.params, kept + r.core_params
            norm, total = norm + r.norm_share * d2, total + d2
        cores.append(core)
        report["experts"].append({"checkpoint": str(ckpt), "param_share": kept / params,
                                  "norm_share": norm / total if total else 1.0})  # fmt: skip
    keys = {k for c in cores for k in c}  # (the checkpoint files' tensors)
    merged = merge({k: base[k] for k in keys}, cores, lam)
    folder = save_folder(model, tok, merged, Path(out))
    report["written"] = str(folder)
    (folder / "sar.json").write_text(json.dumps(report, indent=1))
    return report


def evaluate_model(experts: list[str | Path], folder: str | Path) -> str:
    """Held-out greedy accuracy of the written model and of each expert, on each expert's
    task (its run's held-out set)."""
    from rlpost.llm.config import load_config
    from rlpost.llm.tools.evaluate import evaluate_config

    lines = ["task (run)            sar     expert"]
    for src in experts:
        run, ckpt = checkpoint_of(src)
        cfg = load_config(str(run / "config.yaml"), ["reward.workers=0"])
        mine = evaluate_config(cfg, str(folder))["greedy_accuracy"]
        theirs = evaluate_config(cfg, str(ckpt))["greedy_accuracy"]
        lines.append(f"{cfg.data.describe()[:20]:<20}  {mine:.3f}   {theirs:.3f}")
    return "\n".join(lines)
