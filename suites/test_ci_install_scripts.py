"""CI's installs: ci/install_sglang_cpu.sh runs twice into one venv (.ci/run run again in a checkout), CPU CI installs the
CPU torch build (PyTorch's CPU index on GitHub, the local wheel on the project's CI machines, never PyPI's CUDA build),
and golden-refresh.yml regenerates goldens with that same CPU torch on a GitHub-hosted runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.workflow_files import workflow as _workflow

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# --- D: ci/install_sglang_cpu.sh VENV TORCH_VENV, twice ----------------------------------------------------------------

def _shim(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _fake_torch(site: Path, dist_info: str = "torch-2.13.0+cpu.dist-info") -> None:
    """A torch 2.13.0 distribution (torch, torchgen, functorch, a console script outside site-packages) in `site`."""
    for top in ("torch", "torchgen", "functorch"):
        (site / top).mkdir(parents=True, exist_ok=True)
        (site / top / "__init__.py").write_text("")
    (site / dist_info).mkdir()
    (site / dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {dist_info[6:-10]}\n")
    (site / dist_info / "RECORD").write_text("".join(f"{p},,\n" for p in (
        "torch/__init__.py", "torchgen/__init__.py", "functorch/__init__.py", "../../../bin/torchrun",
        f"{dist_info}/METADATA", f"{dist_info}/RECORD")))


def _install_sglang(tmp_path: Path) -> subprocess.CompletedProcess:
    """The script with VENV's python a stand-in (pip a no-op, purelib = tmp_path/venv-site) and TORCH_VENV's the real
    interpreter seeing only the fake torch: what runs for real is the script and its linking step."""
    site = tmp_path / "venv-site"
    site.mkdir(exist_ok=True)
    _shim(tmp_path / "venv" / "bin" / "python",
          f'case "$1" in -m) exit 0;; esac\ncase "$2" in *sysconfig*) echo "{site}";; *) echo "sglang stand-in";; esac')
    _shim(tmp_path / "torchvenv" / "bin" / "python", f'exec env PYTHONPATH="{tmp_path / "torch-site"}" "{sys.executable}" -S "$@"')
    return subprocess.run(["bash", str(REPO / "ci" / "install_sglang_cpu.sh"), str(tmp_path / "venv"), str(tmp_path / "torchvenv")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def _links(site: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in sorted(site.iterdir()) if p.is_symlink()}


def test_install_sglang_cpu_links_torch_again_on_a_second_run(tmp_path):
    """.ci/run run twice in one checkout: the second run's link step failed with FileExistsError (functorch). Now it
    replaces the links, and a link of a torch since replaced (another dist-info) goes too."""
    _fake_torch(tmp_path / "torch-site")
    first = _install_sglang(tmp_path)
    assert first.returncode == 0, first.stderr
    links = _links(tmp_path / "venv-site")
    assert set(links) == {"torch", "torchgen", "functorch", "torch-2.13.0+cpu.dist-info"}, links
    assert all((tmp_path / "venv-site" / name).resolve() == tmp_path / "torch-site" / name for name in links)
    second = _install_sglang(tmp_path)
    assert second.returncode == 0, second.stderr
    assert _links(tmp_path / "venv-site") == links
    (tmp_path / "torch-site" / "torch-2.13.0+cpu.dist-info").rename(tmp_path / "torch-site" / "torch-2.13.0.dist-info")
    for path in (tmp_path / "torch-site" / "torch-2.13.0.dist-info").iterdir():
        path.write_text(path.read_text().replace("2.13.0+cpu", "2.13.0"))
    third = _install_sglang(tmp_path)
    assert third.returncode == 0, third.stderr
    assert set(_links(tmp_path / "venv-site")) == {"torch", "torchgen", "functorch", "torch-2.13.0.dist-info"}


def test_install_sglang_cpu_leaves_a_torch_of_the_venvs_own_alone(tmp_path):
    _fake_torch(tmp_path / "torch-site")
    (tmp_path / "venv-site" / "torch").mkdir(parents=True)
    (tmp_path / "venv-site" / "torch" / "mine.py").write_text("")
    proc = _install_sglang(tmp_path)
    assert proc.returncode != 0 and "venv-site/torch is no link: VENV has a torch of its own" in proc.stderr, proc.stderr
    assert (tmp_path / "venv-site" / "torch" / "mine.py").exists()


# --- E: the CPU torch build, from the CPU index on GitHub and the local wheel on the project's CI machines ----------------

def _ci_run_torch_pin() -> str:
    (pin,) = re.findall(r"^python -m pip install .*?(torch==\S+)$", (REPO / ".ci" / "run").read_text(), re.M)
    return pin


def _wheel(folder: Path, version: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def _pip_picks(tmp_path: Path, pin: str, *offered: str) -> str:
    """What `pip install PIN` picks where only the wheels of `offered` versions exist ('' when none fits)."""
    for version in offered:
        _wheel(tmp_path / "wheels", version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--no-index",
                           "--find-links", str(tmp_path / "wheels"), pin], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_S)
    found = re.search(r"^Would install (\S+)$", proc.stdout, re.M)
    assert found or "No matching distribution found" in proc.stderr, proc.stdout + proc.stderr
    return found.group(1) if found else ""


def test_ci_installs_the_cpu_torch_build_or_nothing(tmp_path):
    """GitHub: PyPI's torch 2.13.0 (the CUDA build) beside the CPU index's 2.13.0+cpu: the CPU build. The project's CI
    machines: their local 2.13.0+cpu wheel. Where no CPU build is offered, the install fails: before, `torch==2.13.0`
    quietly took PyPI's CUDA build (GBs of nvidia wheels)."""
    pin = _ci_run_torch_pin()
    assert _pip_picks(tmp_path / "github", pin, "2.13.0", "2.13.0+cpu") == "torch-2.13.0+cpu"
    assert _pip_picks(tmp_path / "ci-machine", pin, "2.13.0+cpu") == "torch-2.13.0+cpu"
    assert _pip_picks(tmp_path / "pypi-only", pin, "2.13.0") == ""


def test_cpu_ci_gives_ci_run_the_cpu_index():
    (step,) = [s for s in _workflow("cpu-ci.yml")["jobs"]["cpu"]["steps"] if s.get("run") == "bash .ci/run"]
    assert step.get("env", {}).get("PIP_EXTRA_INDEX_URL") == CPU_INDEX, step


# --- C: golden refresh with .ci/run's CPU torch, on a GitHub-hosted runner --------------------------------------------

def test_golden_refresh_runs_on_cpu_torch_as_ci_verifies_goldens():
    """Goldens are a CPU float64 computation that .ci/run verifies bit for bit with CPU torch 2.13.0: the refresh used
    the GPU runner's CUDA torch. Now: ubuntu-latest, .ci/run's torch pin from the CPU index, no GPU runner set-up."""
    doc = _workflow("golden-refresh.yml")
    refresh = doc["jobs"]["refresh"]
    assert refresh["runs-on"] == "ubuntu-latest"
    steps = refresh["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "setup_gpu_runner" not in runs and "self-hosted" not in str(doc)
    (install,) = [s for s in steps if _ci_run_torch_pin() in s.get("run", "")]
    assert install["env"]["PIP_EXTRA_INDEX_URL"] == CPU_INDEX
    assert re.search(r"pip install .*-e \.$", install["run"], re.M), install["run"]
    assert any(s.get("with", {}).get("python-version") == "3.11" for s in steps)
    order = [i for i, s in enumerate(steps) if s is install or "golden refresh --force" in s.get("run", "")]
    assert len(order) == 2 and steps[order[0]] is install


def test_golden_refresh_concurrency_is_per_ref():
    """No group shared across refs (a workflow-level group let a dispatch elsewhere cancel main's pending refresh)."""
    group = _workflow("golden-refresh.yml")["concurrency"]["group"]
    assert "${{ github.ref }}" in group.replace("${{github.ref}}", "${{ github.ref }}"), group


@pytest.mark.parametrize("needle", ["Allow GitHub Actions to create and approve pull requests", "ubuntu-latest",
                                    CPU_INDEX])
def test_goldens_doc_names_the_refresh_setting_and_runner(needle):
    assert needle in (REPO / "docs" / "goldens.md").read_text()
