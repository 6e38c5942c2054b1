import re

import pytest

from rlpost.llm.config import ConfigError, load_config
from rlpost.llm.recipes import RECIPES_DIR, recipe_path


def test_defaults_recipe_and_overrides_merge_in_order(tmp_path):
    y = tmp_path / "r.yaml"
    y.write_text("optim: {lr: 0.01}\nalgo: {preset: dapo}\n")
    cfg = load_config(y, ["optim.lr=0.02", "rollout.group_size=4"])
    assert cfg.optim.lr == 0.02 and cfg.algo.preset == "dapo" and cfg.preset().group_size == 4
    assert cfg.optim.micro_batch_size == 64  # default kept


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", r"optim\.lrr: unknown field"),
        ("rollout.engine=tpu", r"rollout\.engine: must be one of 'auto', 'lean', 'hf' or 'vllm'"),
        ("optim.lr=-1", r"optim\.lr: Input should be greater than 0"),
        ("algo.preset=grpoo", r"unknown preset 'grpoo'; valid names: .*\bdapo\b"),
        ("train.steps=many", r"train\.steps: Input should be a valid integer"),
        ("rollout.min_new_tokens=9", r"rollout\.min_new_tokens \(9\) is above rollout\.max_new"),
        (
            "rollout={min_new_tokens: 2, speculative: {draft: 1}}",
            r"rollout\.speculative engine does not mask EOS",
        ),
    ],
)
def test_bad_values_fail_at_load_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_bad_entry_parameter_is_named():
    with pytest.raises(ConfigError, match=r"'ppo_clip': unknown parameter\(s\) \['clip_hgih'\]"):
        load_config(None, ["algo.objective.name=ppo_clip", "algo.objective.params.clip_hgih=0.3"])


def test_dr_grpo_normaliser_is_the_generation_budget_the_trainer_provides():
    # the constant entry declares it needs the generation budget (no name-keyed default)
    from rlpost.core import Input

    cfg = load_config(None, ["algo.preset=dr_grpo", "rollout.max_new_tokens=12"])
    assert cfg.preset().aggregation.params == {}
    assert Input.GENERATION_BUDGET in cfg.preset().build().needs()


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_shipped_recipe_validates(name):
    import yaml

    from rlpost.llm.preference import load_preference_config
    from rlpost.llm.runtimes.dlr import load_dlr_config

    # preference recipes (a top-level `loss:` section) load with the preference schema,
    # DLR's (a `latent:` section) with rlpost-llm dlr's
    raw = yaml.safe_load(recipe_path(name).read_text())
    load = load_config
    if "loss" in raw:
        load = load_preference_config
    elif "latent" in raw:
        load = load_dlr_config
    cfg = load(recipe_path(name))
    assert cfg.run.dir.startswith("runs/")


def test_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="grpo_arithmetic"):
        recipe_path("nope")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["data.task=pde"], "data.task_params: task 'pde' has no parameter 'digits'"),
        (["data.task_params={digit: 3}"], "has no parameter 'digit' (its parameters: digits"),
        (["data.curriculum=[{task: countdown, task_params: {digits: 2}, steps: 1}]"],
         "data.curriculum[countdown].task_params: task 'countdown' has no parameter"),
    ],
)  # fmt: skip
def test_a_task_parameter_the_task_does_not_take_is_refused_at_load(overrides, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        load_config(recipe_path("grpo_arithmetic"), overrides)


def test_a_model_path_that_cannot_be_loaded_is_a_one_line_error(tmp_path):
    """Refused at load (before any run directory), and again by the loader for a config
    changed in Python after it was loaded."""
    from rlpost.llm.model.policy import load_policy

    missing = tmp_path / "no-model"
    over = [f"model.path={missing}"]
    with pytest.raises(ConfigError, match=re.escape(f"model.path: '{missing}': no such folder")):
        load_config(recipe_path("grpo_pde"), over)
    base = load_config(recipe_path("grpo_pde"), [])
    cfg = base.model_copy(update={"model": base.model.model_copy(update={"path": str(missing)})})
    with pytest.raises(ValueError, match=re.escape(f"model.path '{missing}': no such folder")):
        load_policy(cfg, progress=False)
    missing.mkdir()  # a folder without a model in it
    with pytest.raises(ConfigError, match=re.escape(f"'{missing}': no config.json")):
        load_config(recipe_path("grpo_pde"), over)
    with pytest.raises(ValueError, match=re.escape(f"model.path '{missing}': no config.json")):
        load_policy(cfg, progress=False)
    # weights only as a pickle (before: a traceback from torch.load refusing it)
    (missing / "config.json").write_text('{"model_type": "llama"}')
    (missing / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(
        ConfigError, match=r"holds its weights only as pickles \(pytorch_model.bin\)"
    ):
        load_config(recipe_path("grpo_pde"), over)


def test_the_plot_title_names_the_users_data_not_the_default_task(tmp_path):
    """Before: a run on the user's own file was plotted as 'grpo on arithmetic'."""
    rows = tmp_path / "chat.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert load_config(None, [f"data.path={rows}"]).data.describe() == "chat.jsonl"
    assert load_config(None, []).data.describe() == "arithmetic"
    mix = "data.mixture=[{task: arithmetic}, {task: countdown}]"
    assert load_config(None, [mix]).data.describe() == "arithmetic + countdown"


def test_a_lora_policy_is_built_without_a_deprecation_warning():
    """Before: every LoRA run printed transformers' FutureWarning (peft reading
    ``is_gradient_checkpointing``)."""
    import warnings

    from transformers import AutoModelForCausalLM

    from rlpost.llm.model import tiny
    from rlpost.llm.model.policy import apply_lora

    lc = load_config(None, ["model.lora={r: 4}"]).model.lora
    tok = tiny.build_tokenizer()
    model = tiny.init_model(AutoModelForCausalLM.from_config, tiny.tiny_config(tok), tok, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        apply_lora(model, lc)


def test_fused_ops_route_the_decoders_norms_and_mlps_and_change_no_output():
    """``model.fused_ops=true``: every RMSNorm and MLP of the loaded policy goes through
    ``rlpost.kernels`` (off CUDA its references, transformers' math), and the policy's
    logits are those of the same weights without it, bit for bit."""
    import torch

    from rlpost.llm.model.policy import load_policy

    plain, _ = load_policy(load_config(None, ["model.path=tiny-random"]), progress=False)
    fused, _ = load_policy(
        load_config(None, ["model.path=tiny-random", "model.fused_ops=true"]), progress=False
    )
    routed = [m for m in fused.modules() if type(m).__name__.endswith(("RMSNorm", "MLP"))]
    assert routed and all("forward" in vars(m) for m in routed)  # instance by instance
    ids = torch.randint(3, 20, (2, 7))
    assert torch.equal(plain(ids).logits, fused(ids).logits)
    # with LoRA: the routed MLPs call the adapted projections (a nonzero adapter shows)
    lora = ["model.path=tiny-random", "model.lora={r: 4}"]
    plain, _ = load_policy(load_config(None, lora), progress=False)
    fused, _ = load_policy(load_config(None, [*lora, "model.fused_ops=true"]), progress=False)
    with torch.no_grad():
        for model in (plain, fused):
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.05)
    with fused.disable_adapter():
        assert not torch.equal(fused(ids).logits, plain(ids).logits)
    assert torch.equal(plain(ids).logits, fused(ids).logits)
