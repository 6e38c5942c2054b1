"""Packaging: every member builds a wheel, the ``rlpost`` namespace stays PEP 420, and
rlpost-core installs and passes its tests alone, without the domain engines."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
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
    for recipe in ("otql_multimodal_reach", "residual/decoding", "deploy/contour"):
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


def test_core_alone_in_fresh_env_passes_its_tests(wheels, tmp_path):
    """Install the rlpost-core wheel (+ pytest) into a new venv, pinned to the versions of
    the development environment so nothing new is downloaded; no domain engine arrives and
    the core test-suite passes against the installed wheel."""
    venv = tmp_path / "venv"
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    pins = subprocess.run(
        [UV, "pip", "freeze", "--python", sys.executable],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        "\n".join(line for line in pins.splitlines() if "==" in line and "rlpost" not in line)
    )
    py = str(venv / "bin" / "python")
    subprocess.run(
        [
            UV,
            "pip",
            "install",
            "-q",
            "--python",
            py,
            "-c",
            str(constraints),
            f"rlpost-core[config,plots] @ {wheels['rlpost-core'].resolve().as_uri()}",
            "pytest",
        ],
        check=True,
        env=env,
    )
    installed = subprocess.run(
        [UV, "pip", "freeze", "--python", py], capture_output=True, text=True, check=True
    ).stdout.lower()
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
        assert f"\n{engine}==" not in "\n" + installed, f"rlpost-core pulled {engine}"
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
            str(ROOT / "packages/rlpost-core/tests"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout
