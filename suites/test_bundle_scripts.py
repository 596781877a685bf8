"""ci/build_offline_bundle.sh and ci/build_sglang_bundle.sh keep what is on disk: an existing OUT is kept (exit 2,
before any download, or after it for one made meanwhile) unless FORCE=1, a file named OUT.part is never the temporary,
and the pins file is never OUT. Offline: PYTHON is a stand-in
whose `pip download` writes one small wheel and whose other commands are this interpreter's."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["ci/build_offline_bundle.sh", "ci/build_sglang_bundle.sh"]
FAKE_PYTHON = f"""#!/usr/bin/env bash
if [ "$1 $2 $3" = "-m pip download" ]; then
    echo download >> "$(dirname "$0")/downloads"
    if [ -n "${{MAKE_OUT:-}}" ]; then echo theirs > "$MAKE_OUT"; fi  # a file made at OUT while the download runs
    while [ $# -gt 0 ] && [ "$1" != -d ]; do shift; done
    mkdir -p "$2"
    exec {sys.executable} -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1], 'w').writestr('sglang/__init__.py', '')" "$2/fake-1-py3-none-any.whl"
fi
exec {sys.executable} "$@"
"""


def build(tmp_path: Path, script: str, out: Path, root: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return subprocess.run(["bash", str(root / script), str(out)], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), **env})


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_existing_out_is_kept_unless_force(tmp_path, script):
    out = tmp_path / "bundle.tar.xz"
    out.write_text("mine")
    proc = build(tmp_path, script, out)
    assert proc.returncode == 2 and "exists; nothing was built" in proc.stderr, proc.stderr
    assert out.read_text() == "mine" and not (tmp_path / "bin" / "downloads").exists()
    proc = build(tmp_path, script, out, FORCE="1")  # twin: FORCE=1 replaces it
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(out) as tar:
        assert "./sglang/__init__.py" in tar.getnames()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_file_named_out_part_is_not_the_temporary(tmp_path, script):
    out = tmp_path / "bundle.tar.xz"
    (tmp_path / "bundle.tar.xz.part").write_text("mine")
    proc = build(tmp_path, script, out)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bundle.tar.xz.part").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "bundle.tar.xz", "bundle.tar.xz.part"]  # no temporary left
    assert out.stat().st_mode & 0o044 == 0o044  # readable as a plain new file is, not a temporary's 0600


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("force", ["", "1"])
def test_a_file_made_at_out_during_the_build_is_kept_unless_force(tmp_path, script, force):
    """OUT free when the build starts, made by someone else while it downloads: kept, one line and exit 2, the new
    bundle removed (before: renamed over it). Twin: with FORCE=1 it is replaced."""
    out = tmp_path / "bundle.tar.xz"
    proc = build(tmp_path, script, out, MAKE_OUT=str(out), FORCE=force)
    if force:
        assert proc.returncode == 0 and tarfile.is_tarfile(out), proc.stderr
    else:
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            f"{Path(script).stem}: {out} appeared while the bundle was built; it was kept and nothing was written (FORCE=1 replaces it)"]
        assert out.read_text() == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "bundle.tar.xz"]  # no temporary left


@pytest.mark.parametrize("link", [False, True])
def test_the_pins_file_is_never_out(tmp_path, link):
    """`FORCE=1 ci/build_sglang_bundle.sh ci/sglang-cpu-pins.txt` (or a link to it) wrote the bundle over its own
    input: refused before any download, one line, exit 2 (on a copy of the script and pins). The twin, another OUT
    with FORCE=1, builds: test_an_existing_out_is_kept_unless_force."""
    root = tmp_path / "repo"
    (root / "ci").mkdir(parents=True)
    for name in ("build_sglang_bundle.sh", "place_bundle.sh", "sglang-cpu-pins.txt"):
        (root / "ci" / name).write_bytes((ROOT / "ci" / name).read_bytes())
    pins = root / "ci" / "sglang-cpu-pins.txt"
    out = pins
    if link:
        out = tmp_path / "link.txt"
        out.symlink_to(pins)
    proc = build(tmp_path, "ci/build_sglang_bundle.sh", out, root=root, FORCE="1")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "is the pins file" in proc.stderr, proc.stderr
    assert pins.read_bytes() == (ROOT / "ci" / "sglang-cpu-pins.txt").read_bytes() and out.samefile(pins)
    assert not (tmp_path / "bin" / "downloads").exists()


def test_sourcing_gpu_env_with_a_missing_bundle_stops_there(tmp_path):
    """`. ci/gpu_env.sh BUNDLE` took eval's status: a bundle that is not there printed its error and the session went
    on without FlashInfer. Now the sourcing returns 2 at that line (the SGLang bundle's line is written the same way)."""
    proc = subprocess.run(["bash", "-c", ". ci/gpu_env.sh /nonexistent/flashinfer.tar.xz; echo \"sourced: $?\""], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert "no such archive" in proc.stderr and proc.stdout.strip() == "sourced: 2", proc.stdout + proc.stderr
