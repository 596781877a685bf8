"""Issue 25, nothing on disk is destroyed: outputs never overwrite inputs nor go into the golden
folder, nor replace a file that exists unless --force; report --out and tpot --json are checked before any work; a killed refresh's leftovers go;
golden verify reports every bad case; run checks the manifest's case spec, against out_fp32, ends
with a summary line, and its --help does not import torch."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.fsio import refuse_overwriting_inputs
from harness.inputs.cases import GOLDEN_DIR, golden_case_names, load_case
from harness.verify import golden
from suites.hang_guard import HANG_GUARD_S
from suites.test_cli import ROOT, _one_error_line, harness
from suites.test_report import _write

CASE = "glm5-tp8.ci.b1-l500"
QUICK = ("--device", "cpu", "--repeats", "0", "--strategy", "gather_cast")
TPOT = ("--device", "cpu", "--shrink", "--slots", "2048", "--repeats", "1", "--strategy", "gather_cast", "--layers", "1")


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A golden copy G (also $MLA_HARNESS_GOLDEN_DIR), a scenario file, a results file and an
    all-reduce table, in tmp_path (the working folder); `snapshot()` maps each input to its bytes."""
    root = _golden_copy(tmp_path, [CASE])
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", str(root))
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "harness" / "spec" / "scenarios" / "b1-l500.toml", tmp_path / "S.toml")
    shutil.copy(ROOT / "harness" / "tpot" / "allreduce_h200_tp2.toml", tmp_path / "T.toml")
    (tmp_path / "D").mkdir()
    _write(tmp_path / "D" / "report.md")  # a results file that happens to carry report --out's file name
    _write(tmp_path / "r.json")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "S.toml", tmp_path / "L.json")
    os.link(tmp_path / "S.toml", tmp_path / "H.toml")
    os.link(root / CASE / golden.OUTPUTS, tmp_path / "linked.safetensors")
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    return lambda: {p: p.read_bytes() for p in files}


REFUSED = {  # id: (argv, the option and a fragment the error line names)
    "run --json into the golden folder": (["run", *QUICK, "--scenario", "b1-l500", "--golden-dir", "G", "--json", f"G/{CASE}/manifest.json"],
                                          ["--json", "manifest.json", "golden folder"]),
    "run --json the scenario file": (["run", *QUICK, "--scenario-file", "S.toml", "--json", "S.toml"], ["--json", "S.toml", "scenario file"]),
    "run --json a symlink to it": (["run", *QUICK, "--scenario-file", "S.toml", "--json", "L.json"], ["--json", "L.json", "scenario file"]),
    "run --json a relative path to it": (["run", *QUICK, "--scenario-file", "S.toml", "--json", "sub/../S.toml"], ["--json", "scenario file"]),
    "run --json a hard link to it": (["run", *QUICK, "--scenario-file", "S.toml", "--json", "H.toml"], ["--json", "H.toml", "scenario file"]),
    "run --json a hard link to a golden": (["run", *QUICK, "--scenario", "b1-l500", "--json", "linked.safetensors"],
                                           ["--json", "linked.safetensors", "golden file"]),
    "run --dump-outputs into a case folder": (["run", *QUICK, "--scenario", "b1-l500", "--dump-outputs", f"G/{CASE}"],
                                              ["--dump-outputs", "golden folder"]),
    "export-inputs --out a golden's outputs": (["export-inputs", "--device", "cpu", "--scenario", "b1-l500", "--out", f"G/{CASE}/outputs.safetensors"],
                                               ["--out", "outputs.safetensors", "golden folder"]),
    "export-inputs --out a hard link to a golden": (["export-inputs", "--device", "cpu", "--scenario", "b1-l500", "--out", "linked.safetensors"],
                                                    ["--out", "golden file"]),
    "report --out over its own input": (["report", "D/report.md", "--out", "D", "--force"], ["--out", "report.md", "results file"]),
    "report --out into the golden folder": (["report", "r.json", "--out", f"G/{CASE}"], ["--out", "golden folder"]),
    "tpot --json the scenario file": (["tpot", *TPOT, "--scenario-file", "S.toml", "--json", "S.toml"], ["--json", "S.toml", "scenario file"]),
    "tpot --json the all-reduce table": (["tpot", *TPOT, "--scenario", "b1-l500", "--allreduce-table", "T.toml", "--json", "T.toml"],
                                         ["--json", "T.toml", "all-reduce table"]),
    "tpot --json into the golden folder": (["tpot", *TPOT, "--scenario", "b1-l500", "--json", "G/t.json"], ["--json", "golden folder"]),
    "run --json the --dump-outputs folder": (["run", *QUICK, "--scenario", "b1-l500", "--dump-outputs", "out", "--json", "out"],
                                             ["--json", "--dump-outputs folder", "must not overlap"]),
    "run --json one of its dumps": (["run", *QUICK, "--scenario", "b1-l500", "--dump-outputs", "out", "--json",
                                     f"out/{CASE}.gather_cast.safetensors"], ["--json", "one of its dumps"]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_outputs_never_overwrite_inputs(disk, name):
    """Each output option pointed at an input (directly, by symlink, relative path or hard link) or
    into the golden folder: one error line naming the option and path, exit 2, no work, no byte changed."""
    argv, fragments = REFUSED[name]
    before = disk()
    proc = harness(*argv)
    _one_error_line(proc, *fragments)
    assert proc.stdout == "", proc.stdout  # refused before any work: nothing rendered, built or timed
    assert disk() == before


EXISTING = {  # id: (argv, its output option, the existing file it would write); each file is the user's, never replaced unasked
    "run --json": (["run", *QUICK, "--scenario", "b1-l500", "--json", "r.json"], "--json", "r.json"),
    "run --json through a symlink": (["run", *QUICK, "--scenario", "b1-l500", "--json", "link.json"], "--json", "notes.txt"),
    "run --dump-outputs": (["run", *QUICK, "--scenario", "b1-l500", "--dump-outputs", "dump"], "--dump-outputs",
                           f"dump/{CASE}.gather_cast.safetensors"),
    "export-inputs --out": (["export-inputs", "--device", "cpu", "--scenario", "b1-l500", "--out", "bundle.safetensors"], "--out",
                            "bundle.safetensors"),
    "tpot --json": (["tpot", *TPOT, "--scenario", "b1-l500", "--json", "r.json"], "--json", "r.json"),
}


@pytest.mark.parametrize("name", EXISTING)
def test_an_existing_file_is_replaced_only_with_force(disk, tmp_path, name):
    """An output path naming a file that exists (a baseline's results, a note): exit 2 and one line
    naming the option, the path and --force, before any work, every byte kept; --force replaces it."""
    argv, flag, existing = EXISTING[name]
    (tmp_path / "notes.txt").write_text("mine")
    os.symlink(tmp_path / "notes.txt", tmp_path / "link.json")
    (tmp_path / "dump").mkdir()
    if not (tmp_path / existing).exists():
        (tmp_path / existing).write_bytes(b"mine")
    before = disk() | {tmp_path / "notes.txt": b"mine", tmp_path / existing: (tmp_path / existing).read_bytes()}
    proc = harness(*argv)
    _one_error_line(proc, flag, "exists", "--force")
    assert proc.stdout == "", proc.stdout  # refused before any work
    assert {p: p.read_bytes() for p in before} == before
    if argv[0] != "tpot":  # the timing run itself is covered by suites/test_model_cli.py
        proc = harness(*argv, "--force")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / existing).read_bytes() != before[tmp_path / existing]
        assert (tmp_path / "link.json").is_symlink()  # written through: the link itself is kept


OWN_TABLES = ("harness/verify/tolerances.toml", "harness/backends/arch_policy.toml", "harness/kernels/fused_tuning.toml",
              "harness/spec/scenarios/b1-l4096.toml", "harness/kernels/fused_mla_cuda.cu", "harness/api.py")


@pytest.mark.parametrize("table", OWN_TABLES)
@pytest.mark.parametrize("command", ["run", "tpot"])
def test_outputs_never_replace_the_harness_own_tables_even_with_force(command, table):
    """The harness's data tables (the tolerances every check reads, the arch policy, the kernel tuning, a built-in
    scenario) and its code (the CUDA source fused_fp8 compiles at run time, its modules) are inputs of every run: an
    output there is refused even with --force, every byte kept (before: `run --json harness/verify/tolerances.toml
    --force` replaced the tolerance table with the results, breaking later runs; the .cu and .py files stayed open)."""
    path = ROOT / table
    before = path.read_bytes()
    argv = {"run": ["run", *QUICK, "--scenario", "b1-l500", "--json"],
            "tpot": ["tpot", *TPOT, "--scenario", "b1-l500", "--json"]}[command]
    try:
        proc = harness(*argv, path, "--force")
        _one_error_line(proc, "--json", str(path), "lies inside the harness's own code")
        assert proc.stdout == "", proc.stdout  # refused before any work
        assert path.read_bytes() == before
    finally:
        path.write_bytes(before)  # a failing run must not leave the checkout broken


def test_tpot_report_keeps_an_earlier_report(tmp_path):
    """python -m harness.tpot.report --out: a folder already holding a tpot.md is refused (exit 2), the file kept."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tpot.md").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "harness.tpot.report", str(tmp_path / "t.json"), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    _one_error_line(proc, "--out", str(out), "already holds files", "--force")
    assert (out / "tpot.md").read_text() == "mine" and os.listdir(out) == ["tpot.md"]


@pytest.mark.parametrize("kind", ["block device", "socket"])
def test_an_output_that_is_a_block_device_or_a_socket_is_refused_before_any_work(tmp_path, monkeypatch, kind):
    """A block device is a disk, not a stream: --json there (or a link to it) is refused before any work, even with
    --force (before: the results were written onto the device's raw bytes after the run); a socket, which cannot be
    opened, likewise (before: 'cannot write' after the whole run)."""
    import socket

    monkeypatch.chdir(tmp_path)
    if kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind("dev.json")
        sock.close()  # the socket file stays
    else:
        try:
            os.mknod("dev.json", 0o600 | stat.S_IFBLK, os.makedev(7, 250))  # a loop device node, nothing attached
        except (PermissionError, OSError) as exc:
            pytest.skip(f"cannot make a block device node here: {exc}")
    os.symlink("dev.json", "link.json")
    for path in ("dev.json", "link.json"):
        for force in ((), ("--force",)):
            proc = harness("run", *QUICK, "--scenario", "b1-l500", "--json", tmp_path / path, *force)
            _one_error_line(proc, "--json", path, kind)
            assert proc.stdout == "", proc.stdout  # refused before any work
    assert stat.S_ISBLK(os.stat("dev.json").st_mode) or stat.S_ISSOCK(os.stat("dev.json").st_mode)


def test_the_guard_itself(tmp_path):
    """fsio.refuse_overwriting_inputs: outputs beside the inputs pass; the same file under any name fails."""
    src, folder = tmp_path / "in.toml", tmp_path / "golden"
    src.write_text("x")
    folder.mkdir()
    os.link(src, tmp_path / "hard")
    os.symlink(folder, tmp_path / "to-golden")
    inputs, protected = [("the input", src)], [("the golden folder", folder)]
    refuse_overwriting_inputs([("--a", tmp_path / "out.json"), ("--b", tmp_path / "new" / "in.toml")], inputs, protected)
    for out in (src, tmp_path / "hard", tmp_path / "x" / ".." / "in.toml", folder, folder / "c" / "m.json", tmp_path / "to-golden" / "f"):
        with pytest.raises(HarnessError, match=r"^--o: "):
            refuse_overwriting_inputs([("--o", out)], inputs, protected)


def test_report_out_must_be_a_new_or_empty_folder_or_forced(disk, tmp_path):
    before = disk()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    proc = harness("report", "r.json", "--out", "busy")
    _one_error_line(proc, "--out", "busy", "--force")
    assert proc.stdout == "" and sorted(os.listdir("busy")) == ["notes.txt"]
    proc = harness("report", "r.json", "--out", "S.toml")  # a file, not a folder: refused before rendering
    _one_error_line(proc, "--out", "S.toml", "not a folder")
    assert proc.stdout == "" and disk() == before
    proc = harness("report", "r.json", "--out", "busy", "--force")
    assert proc.returncode == 0, proc.stderr
    from harness.render.report import REPORT_FILES

    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine" and "report.md" in os.listdir("busy")
    assert set(os.listdir("busy")) - {"notes.txt"} <= set(REPORT_FILES)  # the guard knows every file --out writes
    assert harness("report", "r.json", "--out", "fresh").returncode == 0 and (tmp_path / "fresh" / "report.md").is_file()


def test_results_beside_the_dumps_in_one_folder(disk, tmp_path):
    """The twin of the overlap refusals: --json in the --dump-outputs folder under its own name is written."""
    proc = harness("run", *QUICK, "--scenario", "b1-l500", "--dump-outputs", "out", "--json", "out/results.json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "out")) == sorted([f"{CASE}.gather_cast.safetensors", f"{CASE}.stock.safetensors",
                                                          "results.json"])


def test_a_refused_run_leaves_no_folder_behind(tmp_path, capsys):
    """Output folders are made when written: a run refused after its output checks (a planted fault that cannot
    fire) leaves neither the --json folder nor the --dump-outputs folder (both were created by the checks)."""
    from harness.cli import main

    argv = ["run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "stock",
            "--plant-fault", "remap-off-by-one", "--json", str(tmp_path / "new" / "a" / "r.json"),
            "--dump-outputs", str(tmp_path / "dumps")]
    assert main(argv) == 2 and "remap-off-by-one" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    argv = [a for a in argv if a not in ("--plant-fault", "remap-off-by-one")]  # twin: the same outputs, written
    assert main(argv) == 0 and (tmp_path / "new" / "a" / "r.json").is_file() and os.listdir(tmp_path / "dumps")


def test_a_link_loop_is_refused_not_replaced(tmp_path):
    """A --json that is a link leading back to itself was replaced by a file without --force (it does not 'exist')."""
    from harness.fsio import check_writable

    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    with pytest.raises(HarnessError, match="leads back to itself"):
        check_writable(loop, "--json", force=True)
    assert loop.is_symlink()
    check_writable(tmp_path / "free.json", "--json")  # twin: a free path passes


def test_a_file_made_while_the_run_works_is_kept(tmp_path, monkeypatch, capsys):
    """--json was free when checked; a file that appears there while the run works (the user's, or a second
    run's) is kept: exit 2 naming it, not replaced. Twin: with --force it is replaced."""
    import harness.api
    from harness.cli import main

    out, run = tmp_path / "r.json", harness.api.run

    def run_then_a_file_appears(*args, **kwargs):
        outcome = run(*args, **kwargs)
        out.write_text("mine")
        return outcome

    monkeypatch.setattr(harness.api, "run", run_then_a_file_appears)
    assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --json {out}: a file appeared there while the run worked") and out.read_text() == "mine"
    assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["case"]["scenario"] == "b1-l500"


def test_a_link_made_at_the_path_while_the_run_works_is_not_written_through(tmp_path, monkeypatch, capsys):
    """--json was free when checked; a link made there while the run works (to a golden manifest, say) was written
    through: the file it leads to replaced, or made where it leads. It is refused as a file that appeared, the file
    it leads to kept (or not made). Twin: a link the user made before the run is written through, as documented."""
    import harness.api
    from harness.cli import main

    out, run = tmp_path / "r.json", harness.api.run
    (tmp_path / "victim.json").write_text("mine")
    for victim in (tmp_path / "victim.json", tmp_path / "elsewhere.json"):  # a file, and a path with none yet

        def run_then_a_link_appears(*args, **kwargs):
            outcome = run(*args, **kwargs)
            out.symlink_to(victim)  # noqa: B023 (the loop's own victim, used within its iteration)
            return outcome

        monkeypatch.setattr(harness.api, "run", run_then_a_link_appears)
        assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", str(out)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: --json {out}: a file appeared there while the run worked")
        assert (tmp_path / "victim.json").read_text() == "mine" and not (tmp_path / "elsewhere.json").exists()
        out.unlink()
    monkeypatch.setattr(harness.api, "run", run)
    (tmp_path / "mine.json").symlink_to(tmp_path / "new.json")  # a dangling link given as --json: its target is made
    assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", str(tmp_path / "mine.json")]) == 0
    assert json.loads((tmp_path / "new.json").read_text())["case"]["scenario"] == "b1-l500"


def test_an_output_under_a_dangling_link_is_refused_before_any_work(tmp_path, capsys):
    """An output folder that is a link leading nowhere passed the checks; the write failed after the whole run with
    a false 'a file appeared there' (report: a line not naming --out). Now one line before any work. Twin: the link's
    target made, the run writes into it."""
    from harness.cli import main

    (tmp_path / "dang").symlink_to(tmp_path / "nowhere")
    for argv, flag in ((["run", *QUICK, "--scenario", "b1-l500", "--json", str(tmp_path / "dang" / "x.json")], "--json"),
                       (["report", str(tmp_path / "r.json"), "--out", str(tmp_path / "dang")], "--out")):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert err.strip() == f"error: {flag}: {tmp_path / 'dang'} is a link to {tmp_path / 'nowhere'}, which does not exist; nothing was written"
        assert "case " not in out and not (tmp_path / "nowhere").exists()
    (tmp_path / "nowhere").mkdir()
    assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", str(tmp_path / "dang" / "x.json")]) == 0
    assert (tmp_path / "nowhere" / "x.json").is_file()


def test_a_report_that_fails_midway_leaves_the_earlier_one_whole(disk, tmp_path, monkeypatch):
    """report --force wrote report.md, then each plot: a failure or an interrupt after report.md left a new
    report.md beside the earlier report's plots (the earlier report.md lost). Every file is now staged first, then
    all placed: a failure while staging leaves the earlier report as it was. Twin: the same report unhindered is
    written whole."""
    import harness.fsio
    from harness.cli import main

    assert main(["report", "r.json", "--out", "rp"]) == 0
    earlier = {p.name: p.read_bytes() for p in (tmp_path / "rp").iterdir()}
    stage, staged = harness.fsio._stage, []

    def fail_on_the_second(path, data):
        if staged:
            raise OSError(28, "No space left on device")
        staged.append(path)
        return stage(path, data)

    monkeypatch.setattr(harness.fsio, "_stage", fail_on_the_second)
    _write(tmp_path / "r2.json")
    assert main(["report", "r.json", "r2.json", "--out", "rp", "--force"]) == 2
    assert {p.name: p.read_bytes() for p in (tmp_path / "rp").iterdir()} == earlier and len(earlier) > 1
    monkeypatch.setattr(harness.fsio, "_stage", stage)
    assert main(["report", "r.json", "r2.json", "--out", "rp", "--force"]) == 0
    assert (tmp_path / "rp" / "report.md").read_bytes() != earlier["report.md"]


WRITE = "import sys; from harness.fsio import check_writable, write_text; check_writable(sys.argv[1], '--json'); write_text(sys.argv[1], 'new\\n')"


def test_a_standard_stream_is_written_to_its_descriptor(tmp_path):
    """`--json /dev/stdout --force >> log.txt` renamed a new file over log.txt (through /proc/self/fd/1): its earlier
    lines lost; without --force it was refused as existing. A standard stream's name is written to the descriptor as
    it is open (a redirected file: appended to after >>, after what > left; a pipe; a terminal). Twins: the file under
    its own name is refused as existing; a descriptor open for reading only is refused."""
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    with open(log, "a") as f:
        proc = subprocess.run([sys.executable, "-m", "harness", "run", *QUICK, "--scenario", "b1-l500", "--json", "/dev/stdout",
                               "--force"], stdout=f, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    earlier, results = log.read_text().split("\n", 1)
    assert earlier == "earlier" and json.loads(results)["case"]["scenario"] == "b1-l500"
    (tmp_path / "link").symlink_to("/dev/stdout")

    def write(name, **redirects):
        return subprocess.run([sys.executable, "-c", WRITE, str(name)], cwd=ROOT, timeout=HANG_GUARD_S, **redirects)

    for name in ("/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/1", tmp_path / "link"):
        for mode, expected in (("a", "earlier\nnew\n"), ("w", "new\n")):
            log.write_text("earlier\n")
            with open(log, mode) as f:
                write(name, stdout=f, stderr=f)
            assert log.read_text() == expected, (name, mode)
    assert write("/dev/stdout", capture_output=True).stdout == b"new\n"
    terminal, pty = os.openpty()
    try:
        assert write("/dev/stdout", stdout=pty).returncode == 0 and os.read(terminal, 100).startswith(b"new")
    finally:
        os.close(terminal)
        os.close(pty)
    log.write_text("earlier\n")
    with open(log, "a") as f:
        assert write(log, stdout=f, stderr=subprocess.PIPE).stderr.endswith(b"exists; nothing was written (choose a new path, or --force replaces it)\n")
    with open(log) as f:
        assert write("/dev/fd/0", stdin=f, stderr=subprocess.PIPE).stderr.endswith(b"/dev/fd/0 is not open for writing\n")
    assert log.read_text() == "earlier\n"


@pytest.mark.parametrize("when, forced", [("_stage", False), ("_place", False), ("_place", True)])
def test_several_files_are_written_all_or_nothing(tmp_path, monkeypatch, when, forced):
    """write_files checked each target only as it moved it in: a file that appeared at the 3rd of 3 targets while they
    were staged was kept, but the first two were moved in under an error saying 'nothing was written'. Every target is
    now checked before the first move; a file made there in the moment since (while moving) takes back the new files
    moved in. Twin: a file replaced (--force) cannot be taken back, and the error names it."""
    import harness.fsio
    from harness.fsio import check_writable, write_files

    paths = [tmp_path / name for name in ("report.md", "a.png", "b.png")]
    if forced:
        paths[0].write_text("old")
    for path in paths:
        check_writable(path, "--out", force=forced and path == paths[0])
    original = getattr(harness.fsio, when)

    def a_file_appears_at_the_third(path, *args):
        if path == paths[2] and not path.exists():
            path.write_text("mine")
        return original(path, *args)

    monkeypatch.setattr(harness.fsio, when, a_file_appears_at_the_third)
    with pytest.raises(HarnessError) as error:
        write_files({path: b"new" for path in paths}, "--out")
    written = f"only {paths[0]} was written" if forced else "nothing was written"
    assert str(error.value) == (f"--out {paths[2]}: a file appeared there while the run worked: it was kept and {written} "
                                "(choose a new path, or --force replaces it)")
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"b.png": "mine", **({"report.md": "new"} if forced else {})}


def test_a_link_into_a_missing_folder_is_refused(tmp_path):
    """export-inputs --out, a link to /nonexist/x.safetensors, made /nonexist (a folder wherever a link leads) and wrote
    there. A link whose target's folder does not exist is refused before any work, and a write not checked first
    (goldens) makes no folder either. Twin: a link into a folder that exists makes its target there."""
    from harness.fsio import write_bytes

    out, target = tmp_path / "out.safetensors", tmp_path / "missing" / "deeper" / "x.safetensors"
    out.symlink_to(target)
    argv = ("export-inputs", "--device", "cpu", "--scenario", "b1-l500", "--out", out)
    _one_error_line(harness(*argv), f"--out: {out} is a link to {target}, whose folder {target.parent} does not exist; nothing was written")
    with pytest.raises(HarnessError, match="No such file or directory"):
        write_bytes(out, b"x")
    assert os.listdir(tmp_path) == ["out.safetensors"]
    target.parent.mkdir(parents=True)
    assert harness(*argv).returncode == 0 and target.is_file() and out.is_symlink()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux) to fail a write after the run")
def test_a_write_that_fails_after_the_run_names_its_flag(capsys):
    """A device that refuses the write (full disk) once the run is done: one line naming --json and the path."""
    from harness.cli import main

    assert main(["run", *QUICK, "--scenario", "b1-l500", "--json", "/dev/full"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "error: --json /dev/full: cannot write: No space left on device"


def test_report_force_never_writes_through_a_link_in_out(disk, tmp_path):
    """--force replaces the report's own files in --out; a link there (to a file elsewhere) is refused before any work,
    the file kept."""
    (tmp_path / "precious.json").write_text("mine")
    (tmp_path / "busy").mkdir()
    os.symlink(tmp_path / "precious.json", tmp_path / "busy" / "report.md")
    before = disk()
    proc = harness("report", "r.json", "--out", "busy", "--force")
    _one_error_line(proc, "--out", "report.md", "is a link to", "precious.json", "nothing was written")
    assert (tmp_path / "precious.json").read_text() == "mine" and disk() == before
    assert "environment:" not in proc.stdout, proc.stdout  # refused before the report was rendered (it came after)
    os.unlink(tmp_path / "busy" / "report.md")  # twin: without the link, --force writes the report
    assert harness("report", "r.json", "--out", "busy", "--force").returncode == 0 and not (tmp_path / "busy" / "report.md").is_symlink()


def test_tpot_json_folder_is_refused_before_the_timing_run(tmp_path):
    proc = harness("tpot", *TPOT, "--scenario", "b1-l500", "--json", tmp_path)
    _one_error_line(proc, "--json", "folder")
    assert proc.stdout == "", proc.stdout  # the timing run never started


def test_tpot_engine_sglang_without_sglang_leaves_nothing(tmp_path, monkeypatch):
    shadow = tmp_path / "no-sglang"
    shadow.mkdir()
    (shadow / "sglang.py").write_text("raise ImportError('No module named sglang')\n")  # hides an installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(shadow), str(ROOT))))
    work = tmp_path / "sglang-tpot"
    proc = harness("tpot", "--device", "cpu", "--scenario", "b1-l500", "--engine", "sglang", "--strategy", "gather_cast",
                   "--sglang-python", sys.executable, "--sglang-workdir", work)
    _one_error_line(proc, "--engine sglang", "cannot import sglang")
    assert not work.exists()


def _list_cases(root: Path, names) -> None:
    (root / "cases.toml").write_text("".join('[[case]]\npreset = "{}"\nscale = "{}"\nscenario = "{}"\n'.format(*n.split(".", 2))
                                             for n in names))


def _golden_copy(tmp_path, names) -> Path:
    """A golden folder holding only these cases."""
    root = tmp_path / "G"
    root.mkdir()
    for name in names:
        shutil.copytree(GOLDEN_DIR / name, root / name)
    _list_cases(root, names)
    return root


def test_golden_verify_reports_every_bad_case(tmp_path):
    names = ["glm5-tp8.ci.b1-l500", "glm5-tp8.ci.edge-kv1", "glm5-tp8.ci.contiguous-b4", "glm5-tp8.ci.explicit-slots"]
    root = _golden_copy(tmp_path, names)
    for name in names[0], names[3]:
        (root / name / golden.OUTPUTS).write_bytes(b"garbage")
    stored = golden.load(names[1], root)
    stored.tensors["s0.l0.out_fp32"] += 0.5  # re-signed: only a recompute sees it
    golden.write(stored, names[1], root)
    proc = harness("golden", "verify", golden_dir=root)
    _one_error_line(proc, names[0], "outputs.safetensors: not a safetensors file", "also 1 more unreadable and 1 differ")
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines() if line.startswith("glm5")}
    assert "UNREADABLE" in lines[names[0]] and "MISMATCH" in lines[names[1]] and " ok " in lines[names[2]], proc.stdout
    assert "UNREADABLE" in lines[names[3]], proc.stdout  # the case after the bad ones was checked too
    shutil.rmtree(root / names[0])
    shutil.rmtree(root / names[3])
    names = names[1:3]
    _list_cases(root, names)
    proc = harness("golden", "verify", golden_dir=root)
    assert proc.returncode == 1 and names[1] in proc.stdout and "1 case(s) differ" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("action", ["verify", "refresh"])
def test_killed_refresh_leftovers_are_removed(tmp_path, action):
    root = _golden_copy(tmp_path, [CASE])
    half = golden._marked_folder(root, f".{CASE}.new-")
    (half / golden.OUTPUTS).write_bytes(b"half written")
    proc = harness("golden", action, "--case", CASE, golden_dir=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if action == "verify":  # it only reads: the next refresh removes them
        assert "removed" not in proc.stdout and (half / golden.OUTPUTS).read_bytes() == b"half written"
        return
    assert f"removed {half.name}, left by a killed refresh" in proc.stdout and not half.exists()
    assert sorted(p.name for p in root.iterdir() if p.name != golden.LOCK) == ["cases.toml", CASE]


def _resign(root: Path, edit) -> None:
    path = root / CASE / golden.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    manifest["manifest_sha256"] = golden.manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


STALE = {
    "preset.sm_scale": lambda m: m["preset"].update(sm_scale=m["preset"]["sm_scale"] * 1.01),
    "preset.page_size": lambda m: m["preset"].update(page_size=1),
    "generator": lambda m: m.update(generator="synth-v0"),
    "seed": lambda m: m.update(seed=m["seed"] + 1),
    "scenario.kv_lens": lambda m: m["scenario"].update(kv_lens=[499]),
    "inputs_sha256": lambda m: m.update(inputs_sha256="0" * 64),
}


@pytest.mark.parametrize("name", [n for n in golden_case_names() if ".ci." in n] + ["glm5-tp8.prod.b1-l500"])
def test_committed_goldens_match_their_case_spec(name):
    """The negative control of the check below: no committed golden is called stale, nor short of its case or reshaped."""
    gold, case = golden.load(name), load_case(name)
    assert golden.spec_mismatch(gold, case) == "" and golden.case_mismatch(gold, case) == "" and golden.coverage_gap(gold, case) == ""


@pytest.mark.parametrize("field", STALE)
def test_run_refuses_a_resigned_manifest_of_another_case(tmp_path, field):
    root = _golden_copy(tmp_path, [CASE])  # as committed it passes: test_committed_goldens_match_their_case_spec
    _resign(root, STALE[field])
    _one_error_line(harness("run", *QUICK, "--scenario", "b1-l500", golden_dir=root), f"{CASE}/manifest.json", f"{field} is")


def test_a_users_scenario_of_the_same_name_is_checked_live(tmp_path):
    """Another definition of b1-l500 in the user's own file is another case, not a stale golden."""
    mine = tmp_path / "b1-l500.toml"
    mine.write_text('name = "b1-l500"\nkv_lens = [400]\n')
    proc = harness("run", *QUICK, "--scenario-file", mine)
    assert proc.returncode == 0 and "is for another scenario definition" in proc.stdout, proc.stdout + proc.stderr


def test_run_checks_out_fp32_and_verify_checks_out_bf16(tmp_path):
    """The golden's out_fp32 is what run checks against (README: the float64 reference stored as
    fp32); its out_bf16 is compared bit for bit by verify."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors["s0.l0.out_fp32"] *= 1.05  # out_bf16 untouched
    golden.write(stored, CASE, root)
    proc = harness("run", *QUICK, "--scenario", "b1-l500", golden_dir=root)
    assert proc.returncode == 1 and "gather_cast" in proc.stderr, proc.stdout + proc.stderr
    shutil.rmtree(root / CASE)
    shutil.copytree(GOLDEN_DIR / CASE, root / CASE)
    stored = golden.load(CASE, root)
    stored.tensors["s0.l1.out_bf16"][0, 0, 0] *= 2
    golden.write(stored, CASE, root)
    assert harness("run", *QUICK, "--scenario", "b1-l500", golden_dir=root).returncode == 0
    proc = harness("golden", "verify", golden_dir=root)
    assert proc.returncode == 1 and "s0.l1.out_bf16: 1 elements differ" in proc.stdout, proc.stdout


def test_run_ends_with_a_summary_line(tmp_path):
    out = tmp_path / "r.json"
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"summary: 4 pass, 0 fail, 2 unsupported, 0 error; exit 0; results: --json {out}"
    proc = harness("run", *QUICK, "--scenario", "b1-l500", "--plant-fault", "remap-off-by-one")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "summary: 1 pass, 1 fail, 0 unsupported, 0 error; exit 1; results: not written (no --json)"


def test_run_help_does_not_import_torch_and_lists_every_strategy():
    code = ("import sys, contextlib, io\nfrom harness.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as buf:\n"
            "    try: main(['run', '--help'])\n    except SystemExit: pass\n"
            "print('torch' in sys.modules, ' '.join(buf.getvalue().split()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and proc.stdout.startswith("False "), proc.stdout[:200] + proc.stderr
    from harness.cli.common import strategy_names
    from harness.strategies import ORDER

    assert strategy_names() == list(ORDER) and f"(repeatable): {', '.join(ORDER)}" in proc.stdout
