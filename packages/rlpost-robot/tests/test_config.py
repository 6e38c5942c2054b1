import pytest

from rlpost.robot.config import (
    RECIPES_DIR,
    ConfigError,
    control_preset,
    load_config,
    load_job,
    recipe_path,
    recipes_dir,
)


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_shipped_recipe_validates(name):
    cfg = load_config(recipe_path(name))
    assert cfg.task in name and name.startswith(cfg.algo.name)
    assert cfg.algorithm_config().seed == cfg.run.seed


def test_algo_needs_its_policy_kind():
    with pytest.raises(ConfigError, match=r"policy\.kind='act'"):
        load_config(None, ["algo.name=pac_act"])
    cfg = load_config(None, ["algo.name=pac_act", "policy.kind=act", "task=contour"])
    assert cfg.algorithm_config().prior_coef > 0


def test_errors_name_the_field():
    with pytest.raises(ConfigError, match="beta"):
        load_config(None, ["algo.params.beta=-1"])
    with pytest.raises(ConfigError, match="lr"):
        load_config(None, ["algo.params.lr=1"])
    with pytest.raises(ConfigError, match=r"algo\.name.*otql"):
        load_config(None, ["algo.name=nope"])
    with pytest.raises(ConfigError, match=r"policy\.kind"):
        load_config(None, ["policy.kind=nope"])
    with pytest.raises(FileNotFoundError, match="otql_reacher"):
        recipe_path("nope")


def test_craft_proxy_is_checked_at_load():
    craft = recipe_path("craft_multimodal_reach")
    with pytest.raises(ConfigError, match="counterfactual model"):
        load_config(craft, ["algo.params.proxy=oracle"])
    with pytest.raises(ConfigError, match="counterfactual model"):
        load_config(craft, ["task=contour"])
    cfg = load_config(craft, ["task=contour", "algo.params.mode=real"])
    assert cfg.algorithm_config().mode == "real"


@pytest.mark.parametrize("command", ["residual", "deploy", "record"])
def test_every_job_recipe_validates(command):
    paths = sorted(recipes_dir(command).glob("*.yaml"))
    assert paths
    for path in paths:
        job = load_job(command, recipe_path(path.stem, command))
        if command == "deploy":
            assert job.task == path.stem
        elif command == "record":
            assert path.stem.startswith(job.task) and job.rename
        else:
            assert job.agent_config().seed == job.run.seed
    with pytest.raises(FileNotFoundError, match=f"no shipped {command} recipe"):
        recipe_path("nope", command)


def test_data_and_pretrained_fields():
    cfg = load_config(
        None, ["data.path=my/ds", "data.rename={a.pos: x.pos}", "data.episodes=[0,2]"]
    )
    src = cfg.demo_source()
    assert (src.path, src.rename, src.episodes, src.task) == (
        "my/ds",
        (("a.pos", "x.pos"),),
        (0, 2),
        "multimodal_reach",
    )
    assert load_config(None).demo_source() == {"n_good": 10, "n_poor": 30}  # scripted
    # (a lerobot ACT checkpoint is a setting of the act kind only)
    with pytest.raises(ConfigError, match=r"policy\.params: pretrained: not a setting of policy "
                       r"kind 'flow' \(its settings: bc_steps, hidden, horizon\)"):  # fmt: skip
        load_config(None, ["policy.pretrained=ckpt"])
    with pytest.raises(ConfigError, match=r"policy\.params: bc_steps: Input should be"):
        load_config(None, ["policy.params.bc_steps=0"])
    with pytest.raises(ConfigError, match=r"data\.rename"):
        load_config(None, ["data.rename=[1]"])
    with pytest.raises(ConfigError, match=r"policy\.params: pretrained: deploy runs a train run's"):
        load_job("deploy", recipe_path("contour", "deploy"), ["policy.pretrained=ckpt"])
    with pytest.raises(ConfigError, match=r"data\.nope"):
        load_config(None, ["data.nope=1"])


def test_fleet_and_control_recipes_validate_and_bad_values_are_named():
    job = load_job("fleet", recipe_path("lwd_multimodal_reach", "fleet"))
    assert job.fleet.robots == 4 and len(job.fleet.variant_list()) == 8
    assert job.learner.algo == "lwd"
    assert job.learner.algo_config(job.run.seed).inv_temp == 50.0
    otql = load_job("fleet", None, ["learner.algo=otql", "learner.params.k_samples=4"])
    assert otql.learner.algo_config(0).k_samples == 4
    with pytest.raises(ValueError, match=r"learner\.params: .*'otql'.*inv_temp"):  # LWD's
        load_job("fleet", None, ["learner.algo=otql", "learner.params.inv_temp=50"])
    bad = {
        "fleet.variants=[{name: a, mas: 2}]": r"unknown fields \['mas'\]",
        "fleet.variants=[]": "at least one robot variant",
        "fleet.robots=0": "fleet.robots",
        "intervention.stall_steps=0": "stall_steps must be >= 1",
        "intervention.watch=1": "intervention",
        "learner.params.inv_tmp=3": "inv_tmp",
        "policy.kind=act": "fine-tunes a flow policy",
        "learner.algo=pac_act": r"the fleet runs lwd, otql; got 'pac_act'",
    }
    for override, msg in bad.items():
        with pytest.raises(ValueError, match=msg):
            load_job("fleet", None, [override])
    with pytest.raises(ValueError, match="has no task parameters"):
        load_job("fleet", None, ["task=reacher", "fleet.variants=[{name: a, task: {r: 1}}]"])
    with pytest.raises(ValueError, match=r"task parameters are \["):
        load_job("fleet", None, ["fleet.variants=[{name: a, task: {radius: 1}}]"])
    control = load_job("control", recipe_path("pair_grpo_half_cheetah", "control"))
    assert control.preset == "soft_pair_grpo" and control.env_id == "HalfCheetah-v5"
    assert load_job("control", None, ["preset=grpo"]).preset == "grpo"
    with pytest.raises(ValueError, match="unknown gymnasium environment 'Cheetah-v9'"):
        load_job("control", None, ["env_id=Cheetah-v9"])
    with pytest.raises(ValueError, match="preset"):
        load_job("control", None, ["preset=nope"])
    with pytest.raises(ValueError, match="does not provide"):  # needs a teacher
        load_job("control", None, ["preset=opd"])
    # the recipe drops the presets' KL to the random initial policy; a job can set any weight
    assert control.kl_coef == 0 and control_preset(control).kl_coef == 0
    assert control_preset(load_job("control", None, ["preset=grpo"])).kl_coef == 0.04
    assert control_preset(load_job("control", None, ["kl_coef=0.1"])).kl_coef == 0.1
    with pytest.raises(ValueError, match="kl_coef: preset 'river' has no KL estimator"):
        load_job("control", None, ["preset=river", "kl_coef=0.1"])


def test_the_flat_policy_form_of_older_recipes_reads_into_the_kinds_settings():
    new = load_config(recipe_path("pac_act_contour"))
    assert new.policy.params == {"horizon": 8, "dim_model": 64, "bc_steps": 2000}
    old = load_config(recipe_path("pac_act_contour"), ["policy.bc_steps=10"])  # flat override
    assert old.policy.params == {"horizon": 8, "dim_model": 64, "bc_steps": 10}
    assert old.policy.settings.bc_steps == 10 and old.policy.settings.pretrained is None
    again = type(old).model_validate(old.model_dump())  # round trip
    assert again == old


def test_validating_a_recipe_imports_neither_torch_nor_gymnasium_nor_mujoco():
    """The config modules (algorithms', policy kinds', the task list) are light; only a
    load-time check that needs a runtime object (CRAFT's counterfactual model) imports its
    algorithm."""
    import subprocess
    import sys

    code = (
        "import sys; from rlpost.robot.config import load_config, recipe_path; "
        "[load_config(recipe_path(r)) for r in "
        "('otql_reacher', 'pac_act_contour', 'lwd_multimodal_reach')]; "
        "heavy = [m for m in ('torch', 'gymnasium', 'mujoco') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_importing_the_config_imports_neither_torch_nor_gymnasium_nor_mujoco():
    import subprocess
    import sys

    code = (
        "import sys, rlpost.robot.config; "
        "heavy = [m for m in ('torch', 'gymnasium', 'mujoco') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
