"""Packaging: every member builds a wheel, the ``rlpost`` namespace stays PEP 420,
rlpost-core installs and passes its tests alone, without the domain engines, and each
domain's app installs alone (as README.md says) and trains one step with its command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = str(Path(sys.executable).parent / "uv")
MEMBERS = {
    "rlpost-core": "rlpost/core/",
    "rlpost-kernels": "rlpost/kernels/",
    "rlpost-llm": "rlpost/llm/",
    "rlpost-diffusion": "rlpost/diffusion/",
    "rlpost-robot": "rlpost/robot/",
    "rlpost-app-common": "rlpost/apps/common/",
    "rlpost-app-llm": "rlpost/apps/llm/",
    "rlpost-app-diffusion": "rlpost/apps/diffusion/",
    "rlpost-app-robot": "rlpost/apps/robot/",
}
NAMESPACES = {"rlpost/__init__.py", "rlpost/apps/__init__.py"}


def test_no_namespace_init_in_source_tree():
    found = [p for p in ROOT.glob("*/**/src/rlpost/__init__.py") if ".venv" not in p.parts]
    found += [p for p in ROOT.glob("apps/*/src/rlpost/apps/__init__.py")]
    assert not found, f"rlpost and rlpost.apps are PEP 420 namespaces; remove {found}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [UV, "build", "--all-packages", "--wheel", "--quiet", "-o", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    found = {}
    for whl in out.glob("*.whl"):
        meta = zipfile.ZipFile(whl).read(
            next(n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".dist-info/METADATA"))
        )
        found[Parser().parsestr(meta.decode())["Name"]] = whl
    return found


@pytest.mark.parametrize("dist", sorted(MEMBERS))
def test_wheel_builds_and_ships_no_namespace_init(wheels, dist):
    names = set(zipfile.ZipFile(wheels[dist]).namelist())
    assert not names & NAMESPACES, f"{dist} ships {names & NAMESPACES}"
    assert MEMBERS[dist] + "__init__.py" in names


def test_robot_wheel_ships_its_scenes(wheels):
    names = set(zipfile.ZipFile(wheels["rlpost-robot"]).namelist())
    for scene in ("multimodal_reach.xml", "contour.xml"):
        assert f"rlpost/robot/robots/{scene}" in names, scene
    for recipe in (
        "otql_multimodal_reach",
        "residual/decoding",
        "deploy/contour",
        "record/contour_gantry",
    ):
        assert f"rlpost/robot/recipes/{recipe}.yaml" in names, recipe


def test_core_wheel_requires_only_torch_numpy_safetensors(wheels):
    whl = zipfile.ZipFile(wheels["rlpost-core"])
    meta = Parser().parsestr(
        whl.read(next(n for n in whl.namelist() if n.endswith("METADATA"))).decode()
    )

    def name(req: str) -> str:
        return req.split(">")[0].split("=")[0].split(";")[0].strip()

    reqs = meta.get_all("Requires-Dist")
    assert {name(r) for r in reqs if "extra ==" not in r} == {"torch", "numpy", "safetensors"}
    # the typed-config loader (rlpost.core.io.config, .schema) is the optional extra
    # "config", curves.png (rlpost.core.io.curves) the extra "plots", W&B the extra "wandb"
    extras = {name(r) for r in reqs if "extra ==" in r}
    assert extras == {"pydantic", "omegaconf", "pyyaml", "matplotlib", "wandb"}


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without the development venv (so uv and the commands
    see only the fresh one), plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    return {**env, **extra}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def fresh_venv(path: Path, wheels: dict[str, Path], *requirements: str) -> Path:
    """A new virtual environment at ``path`` with ``requirements`` installed the way a user
    would (``pip install rlpost-app-llm``), resolved against constraints that pin every
    third-party package to the development environment's version (nothing new is
    downloaded) and every ``rlpost-*`` distribution to its built wheel (never an index).
    Offline from uv's cache when it holds every pinned package's index page, else the
    registry is asked for those pages (same versions). Returns the venv's ``bin/``."""
    env = _env()
    _run([UV, "venv", "-q", "--python", sys.executable, str(path)], env=env)
    pins = _run([UV, "pip", "freeze", "--python", sys.executable]).stdout
    constraints = path.parent / f"{path.name}-constraints.txt"
    constraints.write_text(
        "\n".join(
            [line for line in pins.splitlines() if "==" in line and "rlpost" not in line]
            + [f"{dist} @ {whl.resolve().as_uri()}" for dist, whl in sorted(wheels.items())]
        )
    )
    bin_dir = path / "bin"
    cmd = [UV, "pip", "install", "-q", "--python", str(bin_dir / "python")]
    cmd += ["-c", str(constraints), *requirements]
    if subprocess.run([*cmd, "--offline"], capture_output=True, env=env).returncode != 0:
        _run(cmd, env=env)
    installed = installed_dists(bin_dir)
    for dist, where in installed.items():
        if dist.startswith("rlpost-"):
            assert where == wheels[dist].resolve().as_uri(), f"{dist} came from {where}"
    return bin_dir


def installed_dists(bin_dir: Path) -> dict[str, str]:
    """``{distribution name: version or URL}`` of a venv, from ``uv pip freeze``."""
    out = _run([UV, "pip", "freeze", "--python", str(bin_dir / "python")], env=_env()).stdout
    dists = {}
    for line in out.splitlines():
        name, _, where = line.partition(" @ ") if " @ " in line else line.partition("==")
        dists[name.strip().lower()] = where.strip()
    return dists


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_core_alone_in_fresh_env_passes_its_tests(wheels, tmp_path):
    """Install the rlpost-core wheel (+ pytest) into a new venv, pinned to the versions of
    the development environment so nothing new is downloaded; no domain engine arrives and
    the core test-suite passes against the installed wheel."""
    venv = tmp_path / "venv"
    py = str(fresh_venv(venv, wheels, "rlpost-core[config,plots]", "pytest") / "python")
    installed = installed_dists(venv / "bin")
    for engine in (
        "transformers",
        "diffusers",
        "gymnasium",
        "mujoco",
        "ray",
        "peft",
        "datasets",
        "lerobot",
    ):
        assert engine not in installed, f"rlpost-core pulled {engine}"
    # triton may arrive only as a dependency of PyPI's Linux torch wheel, never through
    # rlpost-core; importing rlpost.core must not load it.
    code = (
        "import sys, rlpost.core; assert 'triton' not in sys.modules; print(rlpost.core.__file__)"
    )
    where = subprocess.run(
        [py, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert str(venv) in where.stdout, "rlpost.core must come from the fresh venv"
    tests = subprocess.run(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "--import-mode=importlib",
            # the workspace's addopts (-n 2: pytest-xdist) are not the fresh venv's
            "-o",
            "addopts=",
            "-m",
            "not slow",
            str(ROOT / "packages/rlpost-core/tests"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout


@dataclass(frozen=True)
class DomainApp:
    requirement: str
    """What README.md's "Install one domain" sentence says to pip install."""
    command: str
    args: tuple[str, ...]
    """One step / round of a shipped recipe at toy size (``run.dir`` is added)."""
    absent: tuple[str, ...]
    """Engines of the other domains that must not arrive with it."""


# The shipped recipes on their embedded defaults, into a fresh RLPOST_CACHE. The two
# defaults that are pre-trained on first use for minutes (the LLM "tiny", ~4 min on 2 cores,
# and the "digits" generator, ~1 min) are swapped for their untrained twins of the same
# architecture ("tiny-random", "digits-random"); the digits reward classifier and the
# robot's demonstration set (a LeRobotDataset) and BC policy are built in the fresh cache.
COMMON = ("run.progress=false", "run.threads=1")
DOMAIN_APPS = {
    "llm": DomainApp(
        "rlpost-app-llm",
        "rlpost-llm",
        (
            "train",
            "--config",
            "grpo_arithmetic",
            "train.steps=1",
            "model.path=tiny-random",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=4",
            "data.eval_size=8",
            "reward.workers=0",
            "run.tensorboard=false",
        ),
        ("diffusers", "scikit-learn", "mujoco", "gymnasium", "lerobot", "vllm"),
    ),
    "diffusion": DomainApp(
        "rlpost-app-diffusion",
        "rlpost-diffusion",
        (
            "train",
            "--config",
            "ram_digits",
            "train.steps=1",
            "model.name=digits-random",
            "prompts.per_step=2",
            "prompts.group_size=2",
            "sampler.steps=2",
            "sampler.eval_steps=2",
            "algo.renoise_k=1",
            "run.eval_per_prompt=1",
            "run.tensorboard=false",
        ),
        ("mujoco", "gymnasium", "lerobot", "datasets", "math-verify", "vllm"),
    ),
    # every robot recipe stores its demonstrations as a LeRobotDataset: the lerobot extra
    "robot": DomainApp(
        "rlpost-app-robot[lerobot]",
        "rlpost-robot",
        (
            "train",
            "--config",
            "otql_reacher",
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
        ),
        ("transformers", "diffusers", "peft", "scikit-learn", "math-verify", "vllm"),
    ),
}


def test_readme_install_sentence_names_each_domain_app():
    text = " ".join((ROOT / "README.md").read_text().split())
    for app in DOMAIN_APPS.values():
        req = app.requirement
        assert f"`pip install {req}`" in text or f"`pip install '{req}'`" in text, req


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
@pytest.mark.parametrize("domain", sorted(DOMAIN_APPS))
def test_domain_app_alone_in_fresh_env_trains_one_step(wheels, tmp_path, domain):
    """``pip install rlpost-app-<domain>`` alone into a new venv gives the ``rlpost-<domain>``
    command, which trains one step of a shipped recipe from scratch (a fresh cache) and
    writes the run's summary.json; the other domains' engines do not arrive."""
    app = DOMAIN_APPS[domain]
    bin_dir = fresh_venv(tmp_path / "venv", wheels, app.requirement)
    installed = installed_dists(bin_dir)
    pulled = sorted(set(app.absent) & set(installed))
    assert not pulled, f"{app.requirement} pulled {pulled}"
    run_dir = tmp_path / "run"
    env = _env(RLPOST_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    cmd = [str(bin_dir / app.command), *app.args, *COMMON, f"run.dir={run_dir}"]
    _run(cmd, cwd=tmp_path, env=env, timeout=600)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["domain"] == domain and summary["steps"] >= 1, summary
