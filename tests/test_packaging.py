"""Install paths stay in step: pyproject.toml vs environment.yml, the Makefile's install stamp,
the CI script, the app notebook (stripped, shipped in the wheel)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_PACKAGES = {"python", "pip"}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def pip_requirements(extras: tuple[str, ...] = ("test",)) -> dict[str, SpecifierSet]:
    """What `pip install -e ".[test]"` asks for, with `bertlab[x]` self-references expanded."""
    project = pyproject()["project"]
    lines = list(project["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo += [e for e in req.extras if e not in seen]
            else:
                lines.append(line)
    reqs = [Requirement(r) for r in lines]
    return {canonicalize_name(r.name): r.specifier for r in reqs}


def conda_requirement(line: str) -> tuple[str, SpecifierSet]:
    """`name`, `name>=1.2`, `name=1.2`, `name==1.2=build_*` or `name >=1.2,<2 build_*` -> (pip name, pip
    specifier)."""
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(.*)", line.strip())
    assert m, f"cannot read {line!r} in environment.yml"
    name, rest = m.group(1), m.group(2).split("#")[0].split()
    spec = rest[0] if len(rest) == 2 and rest[0][0] in "<>=!~" else "".join(rest)  # `version build`: no build
    if spec.startswith("=") and not spec.startswith("=="):
        spec = "=" + spec  # conda's fuzzy `=1.2` pins like pip's `==1.2` here
    spec = re.sub(r"^(==[^=,]+)=.*$", r"\1", spec)  # drop a build string
    return canonicalize_name(CONDA_TO_PIP.get(name, name)), SpecifierSet(spec)


def env_requirements() -> dict[str, SpecifierSet]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    out: dict[str, SpecifierSet] = {}
    for dep in env["dependencies"]:
        lines = dep["pip"] if isinstance(dep, dict) else [dep]
        for line in lines:
            if isinstance(dep, dict):
                req = Requirement(line)
                name, spec = canonicalize_name(req.name), req.specifier
            else:
                name, spec = conda_requirement(line)
            assert name not in out, f"{name} is listed twice in environment.yml"
            out[name] = spec
    return out


# -- pyproject.toml vs environment.yml ---------------------------------------------------------
def test_environment_yml_lists_the_same_packages_as_pyproject():
    pip, conda = pip_requirements(), env_requirements()
    python = conda.pop("python")
    conda.pop("pip")
    assert sorted(conda) == sorted(pip), "environment.yml and pyproject.toml list different packages"
    for name, spec in pip.items():
        assert conda[name] == spec, f"{name}: pyproject says {spec!s}, environment.yml says {conda[name]!s}"
    assert python == SpecifierSet(pyproject()["project"]["requires-python"])


def test_torch_is_a_bounded_range_and_the_cpu_build_in_conda():
    spec = pip_requirements()["torch"]  # unbounded, pip would take whatever CUDA build is newest
    assert spec == SpecifierSet(">=2.11,<2.14") and "2.11.0" in spec and "2.13.0" in spec and "2.14.0" not in spec
    env_text = (REPO / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*pytorch\s+>=2\.11,<2\.14\s+cpu_\*", env_text, re.MULTILINE)


def test_the_makefile_asks_pip_for_the_pyproject_torch_range():
    """`make check-torch` dry-runs pip on the torch requirement it reads from pyproject.toml (TORCH_SPEC)."""
    out = subprocess.run(["make", "-pn", "-f", str(REPO / "Makefile")], cwd=REPO, capture_output=True, text=True)
    spec = re.search(r"^TORCH_SPEC := (.*)$", out.stdout, re.MULTILINE)
    assert spec and spec.group(1).strip() == "torch>=2.11,<2.14", out.stdout[-2000:]


def test_conda_parser_reads_the_forms_conda_uses():
    assert conda_requirement("pytorch==2.13.0=cpu_*") == ("torch", SpecifierSet("==2.13.0"))
    assert conda_requirement("pytorch >=2.11,<2.14 cpu_*  # a note") == ("torch", SpecifierSet(">=2.11,<2.14"))
    assert conda_requirement("numpy=1.26") == ("numpy", SpecifierSet("==1.26"))
    assert conda_requirement("huggingface_hub >=0.24") == ("huggingface-hub", SpecifierSet(">=0.24"))


# -- the app notebook --------------------------------------------------------------------------
def test_app_notebook_is_committed_without_outputs():
    nb = json.loads((REPO / "apps" / "bertlab.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "strip the dashboard's outputs"
    assert "BERTLAB_MODEL" in "".join("".join(c["source"]) for c in nb["cells"])


def test_the_notebooks_live_at_the_top_of_the_repository_only():
    """A clone shows apps/ and notebooks/ at its top; the package folder holds no copy of them."""
    from bertlab.settings import shipped

    assert sorted(p.name for p in (REPO / "apps").glob("*.ipynb")) == ["bertlab.ipynb", "teacher.ipynb"]
    assert len(list((REPO / "notebooks").glob("*.ipynb"))) >= 5
    assert not list((REPO / "bertlab").rglob("*.ipynb"))
    assert shipped("apps") == REPO / "apps" and shipped("notebooks") == REPO / "notebooks"
    with pytest.raises(ValueError, match="not shipped"):
        shipped("../data")


def test_wheel_ships_the_dashboards_notebooks_and_licence(wheel):
    """`bertlab serve` and `bertlab notebooks` find their notebooks inside the package (importlib.resources)."""
    assert wheel.name.startswith("bert_classroom_lab-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "bertlab/cli.py" in names and "bertlab/py.typed" in names
    assert {"bertlab/apps/bertlab.ipynb", "bertlab/apps/teacher.ipynb"} <= set(names)
    teaching = {f"bertlab/notebooks/{p.name}" for p in (REPO / "notebooks").glob("*.ipynb")}
    assert teaching and teaching <= set(names)
    assert not any(".data/" in n for n in names)  # nothing outside the package: --user installs find it all
    assert all(n.startswith(("bertlab/", "bert_classroom_lab-")) for n in names)  # no top-level apps/ beside it
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Name: bert-classroom-lab" in text and "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_licence_is_apache_2():
    assert pyproject()["project"]["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


# -- Makefile ----------------------------------------------------------------------------------
def make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_test_creates_the_venv_installs_then_runs_pytest(tmp_path):
    venv = tmp_path / "venv"
    out = make_dry_run("test", f"VENV={venv}", "PYTHON=python3.11")
    steps = [f"python3.11 -m venv {venv}", "pip install --dry-run --no-deps", 'pip install  -e ".[test]"',
             f"touch {venv}/.bertlab-installed", f"{venv}/bin/pytest"]
    positions = [out.find(s) for s in steps]
    assert -1 not in positions and positions == sorted(positions), out


def test_make_test_skips_the_install_when_up_to_date(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    stamp = venv / ".bertlab-installed"
    stamp.touch()
    later = (REPO / "pyproject.toml").stat().st_mtime + 60
    os.utime(stamp, (later, later))
    out = make_dry_run("test", f"VENV={venv}", "PYTEST_ARGS=-m 'not slow'")
    assert "pip install" not in out and "venv" in out and "pytest -m 'not slow'" in out


def test_make_app_serves_with_the_cli(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".bertlab-installed").touch()
    later = (REPO / "pyproject.toml").stat().st_mtime + 60
    os.utime(venv / ".bertlab-installed", (later, later))
    out = make_dry_run("app", f"VENV={venv}", "PORT=9000", "MODEL=bert-base-uncased")
    assert f'{venv}/bin/bertlab serve --port 9000 --model "bert-base-uncased"' in out
    # the training tabs' data, found where `make bench` finds it (unless BERTLAB_DATA says otherwise)
    shared = (REPO.parent / "shared" / "data").resolve()
    assert f'data="${{BERTLAB_DATA:-{shared}}}"' in out and 'BERTLAB_DATA="$data"' in out
    assert "make app BERTLAB_DATA=/path/to/data" in out  # what it says when there is none


# -- .ci/run -----------------------------------------------------------------------------------
def fake_ci(tmp_path: Path, with_chromium: bool, with_data: bool) -> tuple[subprocess.CompletedProcess, Path]:
    """Run a copy of .ci/run beside stub `make`, `apt-get`, `npm` (and maybe `chromium` and
    `configurable-http-proxy`, as installed) that log their calls."""
    repo, stubs, log = tmp_path / "repo", tmp_path / "stubs", tmp_path / "calls.log"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "run", repo / ".ci" / "run")
    if with_data:
        (tmp_path / "shared" / "data").mkdir(parents=True)
    stubs.mkdir()
    for tool in ("dirname", "id", "env", "pwd"):
        if shutil.which(tool):
            (stubs / tool).symlink_to(shutil.which(tool))
    fakes = ["make", "apt-get", "npm"] + (["chromium", "configurable-http-proxy"] if with_chromium else [])
    for name in fakes:
        (stubs / name).write_text(f'#!/bin/bash\necho "{name} $* | BERTLAB_DATA=${{BERTLAB_DATA:-}} CI=$CI" >> {log}\n')
    (stubs / "sudo").write_text('#!/bin/bash\nexec "$@"\n')  # CI may run as a user or as root
    for stub in stubs.iterdir():
        if not stub.is_symlink():
            stub.chmod(0o755)
    env = {"PATH": str(stubs), "HOME": str(tmp_path)}
    out = subprocess.run(["/bin/bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    return out, log


def test_ci_installs_chromium_exports_data_and_runs_make_test(tmp_path):
    out, log = fake_ci(tmp_path, with_chromium=False, with_data=True)
    assert out.returncode == 0, out.stderr
    data = (tmp_path / "shared" / "data").resolve()
    assert log.read_text().splitlines() == [
        "apt-get update | BERTLAB_DATA= CI=",
        "apt-get install -y chromium | BERTLAB_DATA= CI=",
        "npm install -g configurable-http-proxy | BERTLAB_DATA= CI=",
        f"make lint | BERTLAB_DATA={data} CI=true",
        f"make docs | BERTLAB_DATA={data} CI=true",
        f"make test | BERTLAB_DATA={data} CI=true",
    ]


def test_ci_skips_chromium_install_and_data_when_not_needed(tmp_path):
    out, log = fake_ci(tmp_path, with_chromium=True, with_data=False)
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [f"make {t} | BERTLAB_DATA= CI=true" for t in ("lint", "docs", "test")]


def test_ci_script_is_executable_bash_with_strict_mode():
    script = REPO / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text


def test_make_docs_and_lint_install_their_extras_then_run(tmp_path):
    venv = tmp_path / "venv"
    out = make_dry_run("docs", "lint", f"VENV={venv}", "PYTHON=python3.11")
    steps = ['pip install  -e ".[test]"', 'pip install  -e ".[test,docs,lint]"', f"{venv}/bin/mkdocs build --strict",
             f"{venv}/bin/ruff check bertlab tests bench"]
    positions = [out.find(s) for s in steps]
    assert -1 not in positions and positions == sorted(positions), out
    extras = pyproject()["project"]["optional-dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in extras["docs"]} == {"mkdocs", "mkdocs-material"}
    assert [Requirement(r).name for r in extras["lint"]] == ["ruff"]


def test_the_docs_site_lists_every_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {next(iter(item.values())) for item in config["nav"]}
    assert listed == {p.name for p in (REPO / "docs").glob("*.md")} and config["strict"] is True
