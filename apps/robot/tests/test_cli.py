from rlpost.apps.robot.cli import main


def test_demo_end_to_end_smoke(tmp_path, monkeypatch, capsys):
    """The demo's whole path (demo set, BC, OTQL, evaluation, plots) at toy size."""
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    args = [
        "demo",
        "--out",
        str(out),
        "--episodes",
        "4",
        "--eval-episodes",
        "4",
        "--bc-steps",
        "50",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "after OTQL" in text and "integration steps" in text
    assert (out / "success.png").is_file() and (out / "demo.json").is_file()
    assert (out / "policy" / "model.safetensors").is_file()


def test_tasks_and_bad_task(capsys):
    assert main(["tasks"]) == 0
    assert "contour" in capsys.readouterr().out
    assert main(["tasks", "--names"]) == 0
    assert "action:      x.pos, y.pos, z.pos" in capsys.readouterr().out
    assert main(["build-base", "--task", "walker"]) == 2


def test_tasks_measures_the_scripted_demonstrators(capsys):
    assert main(["tasks", "--episodes", "2"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["reacher"][:3] == ["1.00", "0.00", "0.00"]  # the good expert reaches, random not
    assert "N" in rows["contour"] and len(rows["multimodal_reach"]) == 3  # force where logged


def test_train_recipe_with_overrides_and_config_errors(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    small = [
        "algo.params.episodes=2",
        "algo.params.envs=2",
        "algo.params.updates_per_round=2",
        "algo.params.critic_pretrain_steps=5",
        "policy.bc_steps=20",
        "policy.hidden=32",
        "demos.n_good=2",
        "demos.n_poor=2",
        "run.eval_episodes=2",
        "run.eval_steps=[1]",
        "run.progress=false",
        f"run.dir={run}",
    ]
    assert main(["train", "--config", "otql_reacher", *small]) == 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 1  # one OTQL round
    assert (run / "config.yaml").is_file() and (run / "policy" / "config.json").is_file()
    lerobot_copy = json.loads((run / "policy" / "lerobot" / "config.json").read_text())
    assert lerobot_copy["type"] == "rlpost_flow"  # the flow's copy lerobot's factory loads
    capsys.readouterr()
    # eval reproduces the run's own evaluation after fine-tuning (same episodes and seed)
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--episodes", "2", "--out", str(out)]) == 0
    assert "success" in capsys.readouterr().out
    import json

    after = json.loads((run / "demo.json").read_text())["after_metrics"]["1"]
    assert json.loads(out.read_text())["by_steps"]["1"] == after
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "not a finished rlpost-robot train run" in capsys.readouterr().err
    assert main(["train", "--config", "otql_reacher", "task=walker"]) == 2
    assert "task" in capsys.readouterr().err
    assert main(["train", "--config", "otql_reacher", "algo.params.coupling=sinkhorn"]) == 2


def _small_run(tmp_path, algo: str) -> list[str]:
    common = ["demos.n_good=2", "demos.n_poor=2", "run.eval_episodes=2", "run.progress=false"]
    per_algo = {
        "pac_act": [
            "algo.params.episodes=2",
            "algo.params.envs=2",
            "algo.params.updates_per_round=2",
            "algo.params.critic_pretrain_steps=2",
            "policy.bc_steps=10",
            "policy.dim_model=16",
        ],
        "craft": [
            "algo.params.episodes=4",
            "algo.params.envs=2",
            "policy.bc_steps=20",
            "policy.hidden=32",
        ],
    }
    return [*common, *per_algo[algo], f"run.dir={tmp_path / algo}"]


def test_train_pac_act_and_craft_recipes(tmp_path, monkeypatch, capsys):
    """PAC-ACT (ACT on contour, force metrics) and CRAFT recipes end to end at toy size."""
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--config", "pac_act_contour", *_small_run(tmp_path, "pac_act")]) == 0
    text = capsys.readouterr().out
    assert "after PAC-ACT" in text and "peak contact force" in text
    assert '"kind": "act"' in (tmp_path / "pac_act" / "policy" / "config.json").read_text()
    craft = _small_run(tmp_path, "craft")
    assert main(["train", "--config", "craft_multimodal_reach", *craft]) == 0
    assert "after CRAFT" in capsys.readouterr().out
    assert (tmp_path / "craft" / "metrics.jsonl").read_text().count("\n") == 2  # two rounds
    assert main(["train", "--config", "craft_multimodal_reach", "policy.kind=flow"]) == 2
    # the fine-tuned PAC-ACT policy drives the simulated arm through lerobot's Robot
    deploy = ["deploy", "--config", "contour", f"policy.run={tmp_path / 'pac_act'}"]
    run = tmp_path / "deploy"
    assert main([*deploy, "episodes=2", "max_steps=12", f"run.dir={run}"]) == 0
    text = capsys.readouterr().out
    assert "act policy of" in text and "peak force" in text
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and '"steps": 12' in rows[0]
    assert (run / "deploy.png").is_file()
    wrong = ["deploy", "--config", "multimodal_reach", f"policy.run={tmp_path / 'pac_act'}"]
    assert main([*wrong, f"run.dir={tmp_path / 'wrong'}"]) == 2
    err = capsys.readouterr().err  # matched by name: the point-mass robot has no z axis
    assert "lacks the policy's observation features ['z.pos', 'z.vel'" in err
    assert "goal0.x" in err
    assert main([*deploy, "robot.type=no_such_arm", f"run.dir={run}", "--overwrite"]) == 2
    assert "so101_follower" in capsys.readouterr().err  # lerobot's arms are listed


def test_residual_recipe_end_to_end(tmp_path, capsys):
    run = tmp_path / "residual"
    small = ["data.train=4", "data.test=2", "data.steps=40", "agent.steps=20", "agent.hidden=16"]
    args = ["residual", "--config", "decoding", *small, "run.progress=false", f"run.dir={run}"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "+ residual RL" in text and "+ supervised residual" in text
    assert (run / "agent" / "model.safetensors").is_file() and (run / "trajectory.png").is_file()
    assert main(["residual", "--config", "decoding", "agent.window=0"]) == 2
    assert "window" in capsys.readouterr().err


def test_a_toy_algorithm_registered_here_trains_through_the_cli(tmp_path, monkeypatch, capsys):
    """An algorithm defined and registered by this test (success-filtered BC on its own
    online episodes) runs through ``rlpost-robot train`` without touching a package file."""
    from dataclasses import dataclass

    import torch

    from rlpost.robot.algos import ALGORITHMS
    from rlpost.robot.algos.base import Algorithm, register_algorithm
    from rlpost.robot.algos.common import chunk_transitions, online_loop
    from rlpost.robot.demos import collect_episodes
    from rlpost.robot.policies.bc import ChunkController

    @dataclass(frozen=True)
    class ToyConfig:
        episodes: int = 2
        envs: int = 2
        lr: float = 1e-3
        seed: int = 0

    class ToyLearner:
        def __init__(self, policy, task, cfg):
            self.policy, self.task = policy, task
            self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
            self.steps = 0

        def collect(self, n, seed):
            ctrl = ChunkController(self.policy, execute=self.policy.cfg.horizon)
            return collect_episodes(self.task, ctrl, n_episodes=n, seed=seed, n_envs=n)

        def update(self, episodes):
            buf = chunk_transitions(episodes, self.policy.cfg.horizon, 1, 0.99)
            w = torch.ones(len(buf))  # every step of every episode, weight 1
            before = [p.detach().clone() for p in self.policy.parameters()]
            self.policy.train()
            loss = self.policy.flow_loss(buf.obs, buf.chunks, w, mask=buf.mask)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.policy.eval()
            self.steps += 1
            moved = sum(
                (p - b).abs().sum().item()
                for p, b in zip(self.policy.parameters(), before, strict=True)
            )
            success = sum(e.success for e in episodes) / len(episodes)
            return {"loss": loss.item(), "moved": moved, "online_success": success}

    def run(ctx):  # a RunContext: policy, task, demos, config, log, progress, checkpoints
        cfg = ctx.config
        learner = ToyLearner(ctx.policy, ctx.task, cfg)
        return {"history": online_loop(learner, cfg.episodes, cfg.envs, cfg.seed, ctx.log)}

    register_algorithm(
        Algorithm("toy_bc", "TOY", "(this test)", ToyConfig, policy_kind="flow", run=run)
    )
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(
        "task: reacher\nalgo:\n  name: toy_bc\n  params: {episodes: 2, envs: 2, lr: 0.001}\n"
        "policy: {bc_steps: 20, hidden: 32}\ndemos: {n_good: 2, n_poor: 2}\n"
        f"run: {{eval_episodes: 2, eval_steps: [1], progress: false, dir: {tmp_path / 'run'}}}\n"
    )
    try:
        assert main(["train", "--config", str(recipe)]) == 0
        assert "after TOY" in capsys.readouterr().out
        import json

        rows = [
            json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 1 and rows[0]["moved"] > 0  # one round, one update that moved
        assert main(["train", "--config", str(recipe), "algo.params.lr=-1x"]) == 2
        assert "lr" in capsys.readouterr().err
    finally:
        ALGORITHMS.unregister("toy_bc")
    assert main(["train", "--config", str(recipe)]) == 2  # gone: the name is unknown again


def test_control_recipe_end_to_end(tmp_path, capsys, monkeypatch):
    """Pair-GRPO's control job on HalfCheetah at toy size: the table, curves, policy; no
    MUJOCO_LOG.TXT left in the working directory."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "control"
    small = ["iterations=2", "starts=2", "group_size=2", "horizon=20", "eval_every=2"]
    args = ["control", "--config", "pair_grpo_half_cheetah", *small, f"run.dir={run}"]
    assert main([*args, "run.progress=false"]) == 0
    assert (
        "soft_pair_grpo on HalfCheetah-v5: 2 iterations, 160 env steps" in capsys.readouterr().out
    )
    assert (run / "returns.png").is_file() and (run / "policy" / "model.safetensors").is_file()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_without_lerobot_the_fleet_says_what_to_install(tmp_path, monkeypatch, capsys):
    """``pip install rlpost-app-robot`` without the ``[lerobot]`` extra: the fleet (whose
    demonstrations and store are LeRobotDatasets) stops with one line naming the extra, no
    traceback."""
    import sys

    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))  # demos not built yet
    monkeypatch.setitem(sys.modules, "lerobot.datasets.lerobot_dataset", None)  # not installed
    run = tmp_path / "fleet"
    assert main(["fleet", "--robots", "1", "--minutes", "0.1", f"run.dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "rlpost-robot: LeRobotDataset I/O needs lerobot: pip install 'rlpost-robot[lerobot]' "
        "(the app: 'rlpost-app-robot[lerobot]')"
    ]
