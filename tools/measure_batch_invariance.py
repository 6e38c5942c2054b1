"""How far a row's log-probs drift with the rows that share its forward, with and without
``model.batch_invariant``, in float32 and bfloat16 (the numbers in docs/llm.md, "Batch
invariance"). CPU, the embedded ``tiny`` model, one thread:

    uv run python tools/measure_batch_invariance.py
"""

from __future__ import annotations

import tempfile

import torch

from rlpost.llm.config import load_config
from rlpost.llm.rollout.engines import HFEngine, SamplingParams
from rlpost.llm.train.forward import Forwards
from rlpost.llm.trainer import Trainer

OVERRIDES = [
    "model.path=tiny", "rollout.max_new_tokens=16", "rollout.prompts_per_step=16",
    "rollout.group_size=8", "reward.workers=0", "run.progress=false", "run.tensorboard=false",
    "run.threads=1", "run.device=cpu", "data.eval_size=8",
]  # fmt: skip


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        over = [*OVERRIDES, f"run.dir={tmp}/run"]
        tr = Trainer(load_config(None, over), reward_fn=lambda c, e: 0.0)
        for dtype in (torch.float32, torch.bfloat16):
            model = tr.model.to(dtype)
            prompts = [tr.tok(f"{a}+{a + 30}=", add_special_tokens=False).input_ids
                       for a in range(10, 26)]  # fmt: skip
            torch.manual_seed(0)
            batch = HFEngine(model, tr.tok).generate(prompts, 8, SamplingParams(16, 1.0))
            m = batch.mask > 0
            for inv in (False, True):
                lp = {}
                for mbs in (1, 8):
                    cfg = load_config(None, [*over, f"optim.micro_batch_size={mbs}",
                                             f"model.batch_invariant={inv}"])  # fmt: skip
                    lp[mbs] = Forwards(cfg, tr.learner, model, 1.0).nograd(model, batch).logp
                d = (lp[1] - lp[8]).abs()[m]
                e = (batch.logprobs - lp[8]).abs()[m]
                print(
                    f"{str(dtype).removeprefix('torch.'):<9} batch_invariant={inv!s:<5}  "
                    f"mb1 vs mb8: {float((d > 0).float().mean()):6.1%} of tokens, max "
                    f"{float(d.max()):.3g}   engine vs trainer: {float((e > 0).float().mean()):6.1%},"
                    f" max {float(e.max()):.3g}   ({int(m.sum())} tokens)"
                )
        tr.close()


if __name__ == "__main__":
    main()
