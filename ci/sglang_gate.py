#!/usr/bin/env python3
"""The SGLang gate: the harness's benchmarks on commits of YOUR SGLang checkout.

usage:
  python -m ci.sglang_gate --sglang-repo PATH BASE HEAD [--factor 1.05] [--bench REGEX] [-- ASV ARGS...]
  python -m ci.sglang_gate --sglang-repo PATH --json OUT COMMIT [-- HARNESS RUN ARGS...]

The first form is the perf gate over asv (`ci/asv_gate.py`: 0 clean, 1 regression or a failing
verdict, 2 failure) with an asv configuration whose `repo` is the SGLang checkout: each commit is
installed `pip install --no-deps` into its own environment, which sees the runner's packages
(CUDA torch, FlashInfer, SGLang's dependencies, the harness: `ci/asv_sglang_env.py`); the
harness's benchmarks (suites/asv, through ci/asv_sglang_bench with each strategy's verdict added)
then time and check the SGLang-backed strategies. The second form installs
one commit the same way (into a temporary folder put first on PYTHONPATH) and runs
`python -m harness run --json` with it into a private file, copied to OUT (a file or a stream such as /dev/stdout),
so `python -m harness compare BASE.json HEAD.json` gates two commits (a run that checked none of the commit's SGLang,
every SGLang-backed strategy unsupported, exits 2 with one line naming why). --sglang-repo defaults to $MLA_SGLANG_REPO; the checkout's Python project is
its python/ folder (SGLang's layout) or its root, which the gate only reads (each commit is built in a clone). Bad input
(not a git repository, an unknown commit, BASE and HEAD one commit, no SGLang project at a commit, an OUT `harness run`
would refuse, an output inside the SGLang checkout, a --work folder that holds files and is not the gate's or has a link
where the gate writes, a --bench that is no regex, a gate option with --json, a usage error) is one line and exit 2,
before anything runs; Ctrl-C or SIGTERM (a cancelled job) stops the `harness run` it started, removes the temporary
install (pip's temporary folders with it), says 'interrupted' and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ci import asv_gate
from harness import envvars
from harness.errors import HarnessError, interruptible
from harness.fsio import check_writable, write_bytes

ROOT = Path(__file__).resolve().parents[1]  # the harness checkout: benchmarks and harness come from here
BAD_INPUT = 2
DEFAULT_WORK = ROOT / ".asv" / "sglang"
WORK_OUTPUTS = ("asv.conf.json", "env", "results", "html")  # what the gate and asv write in --work
DEFAULT_SCENARIOS = "b32-l4096"  # MLA_ASV_SCENARIOS unless given
INSTALL = "python -m pip install --no-deps --no-build-isolation --no-index --no-compile --ignore-installed --quiet"
# SGLang's own switch (python/setup.py) for a build without its Rust extension modules (gRPC server, multimodal,
# radix tree: nothing the decode path imports). With setuptools-rust in the runner's environment SGLang's build
# otherwise runs cargo on ../rust, which needs crates.io (the runner is air-gapped). Set it yourself to override.
BUILD_ENV = {"SGLANG_BUILD_RUST_EXTS": "none"}


def _runner_reasons() -> dict[str, str | None]:
    """{SGLang-backed strategy: why no commit can run it on this runner, or None}, in the registry's order."""
    from harness.strategies import ORDER, REGISTRY

    return {name: REGISTRY[name].runner_reason() for name in ORDER if REGISTRY[name].runs_sglang}


def sglang_strategies() -> list[str]:
    """The registry's strategies that run the installed SGLang and can run on this runner at some commit:
    MLA_ASV_STRATEGIES / --strategy unless given (one no commit can run would be n/a at both, and fail the gate)."""
    return [name for name, reason in _runner_reasons().items() if not reason]


def left_out() -> list[str]:
    """Why each SGLang-backed strategy left out of the default list cannot run here."""
    return [reason for reason in _runner_reasons().values() if reason]


class BadInput(Exception):
    """One line naming the argument at fault; exit 2."""


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def check_repo(path: str | None) -> tuple[Path, str]:
    """The checkout's top-level folder and where the given folder lies in it ('' at the top, else 'a/b/': SGLang kept
    in a folder of a larger repository), or BadInput."""
    if not path:
        raise BadInput("--sglang-repo: not given (nor MLA_SGLANG_REPO)")
    repo = Path(path).expanduser()
    if not repo.is_dir():
        raise BadInput(f"--sglang-repo {path}: no such folder")
    top = git(repo, "rev-parse", "--show-toplevel", "--show-prefix")
    if top.returncode != 0:
        bare = git(repo, "rev-parse", "--is-bare-repository").stdout.strip() == "true"
        raise BadInput(f"--sglang-repo {path}: " + ("a bare repository: give a checkout of SGLang (git clone it)" if bare
                                                    else "not a git repository"))
    toplevel, prefix = (top.stdout.splitlines() + [""])[:2]
    return Path(toplevel).resolve(), prefix.strip()


def checkout_folders(repo: Path) -> list[Path]:
    """The checkout's work tree and its git folders (a worktree's lie elsewhere), links resolved."""
    out = git(repo, "rev-parse", "--git-dir", "--git-common-dir").stdout.splitlines()
    return list(dict.fromkeys([repo, *((repo / p).resolve() for p in out)]))


def refuse_inside_checkout(repo: Path, outputs: list[tuple[str, Path | None]]) -> None:
    """BadInput when an output (option, path; None: not given) lies in the SGLang checkout, which the gate only reads."""
    folders = checkout_folders(repo)
    for flag, path in ((flag, path) for flag, path in outputs if path is not None):
        real = Path(os.path.realpath(path))
        if any(real == f or f in real.parents for f in folders):
            raise BadInput(f"{flag}: {path} lies inside your SGLang checkout {repo}: the gate never writes there")


def resolve(repo: Path, what: str, ref: str) -> str:
    """The full hash of `ref` in `repo`, or BadInput naming it."""
    out = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if out.returncode != 0:
        raise BadInput(f"{what} {ref!r}: unknown commit in {repo}")
    return out.stdout.strip()


def project_subdir(repo: Path, commit: str, ref: str, folder: str = "") -> str:
    """Where the commit's SGLang Python project is, relative to the repository's top: `folder`python (SGLang's layout)
    or `folder` itself (check_repo's 'a/b/'), else python/ or the top."""
    places = list(dict.fromkeys((f"{folder}python", folder.rstrip("/"), "python", "")))
    for sub in places:
        prefix = f"{sub}/" if sub else ""
        files = [f"{commit}:{prefix}pyproject.toml", f"{commit}:{prefix}sglang/__init__.py"]
        if all(git(repo, "cat-file", "-e", f).returncode == 0 for f in files):
            return sub
    where = ", ".join(f"{sub}/" for sub in places[:-1]) + " or the root"
    raise BadInput(f"{ref!r} in {repo}: no SGLang project (pyproject.toml beside sglang/) at {where}")


def asv_config(repo: Path, subdir: str, work: Path) -> dict:
    """asv configuration: SGLang commits installed --no-deps, the harness's benchmarks timing them."""
    return {
        "version": 1,
        "project": "sglang",
        "repo": str(repo),
        "repo_subdir": subdir,
        "branches": ["HEAD"],
        "dvcs": "git",
        "environment_type": "sglang-runner-virtualenv",
        "plugins": [".ci.asv_sglang_env"],
        "build_command": [],
        "install_command": [f"in-dir={{env_dir}} {INSTALL} {{build_dir}}"],
        "uninstall_command": ["return-code=any python -m pip uninstall -y sglang"],
        "launch_method": "spawn",
        "benchmark_dir": str(ROOT / "ci" / "asv_sglang_bench"),
        "env_dir": str(work / "env"),
        "results_dir": str(work / "results"),
        "html_dir": str(work / "html"),
        "build_cache_size": 0,
    }


MADE_BY = "// made by python -m ci.sglang_gate, which rewrites it on every run\n"  # asv reads JSON5: a comment


def _starts_with_made_by(path: Path) -> bool:
    """Whether the file begins with the gate's mark (only that many bytes are read: a device or an endless file is
    not the gate's either)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(len(MADE_BY.encode())) == MADE_BY.encode()


def check_work(repo: Path, work: Path) -> None:
    """--work is new, empty or the gate's own (its asv.conf.json), outside the SGLang checkout, the goldens and the
    harness's code, with no link where the gate or asv writes: nothing of yours there is replaced or written through."""
    from harness.inputs.cases import refuse_clobbering

    path = work / "asv.conf.json"
    if path.exists() and not _starts_with_made_by(path):
        raise BadInput(f"--work: {path} exists and is not the gate's: it is kept (choose another --work folder)")
    if link := next((work / n for n in WORK_OUTPUTS if (work / n).is_symlink()), None):
        raise BadInput(f"--work: {link} is a link to {os.path.realpath(link)}: the gate never writes through one")
    refuse_inside_checkout(repo, [("--work", work)])
    refuse_clobbering([("--work", work)], [])
    if work.is_dir() and not path.exists() and any(work.iterdir()):
        raise BadInput(f"--work: {work} holds files and is not the gate's folder: they are kept (choose a new or empty one)")


def write_config(repo: Path, subdir: str, work: Path) -> Path:
    """The gate's asv configuration in `work` (`check_work`: a folder or file of yours there is bad input)."""
    path = work / "asv.conf.json"
    try:
        check_work(repo, work)
        work.mkdir(parents=True, exist_ok=True)
        path.write_text(MADE_BY + json.dumps(asv_config(repo, subdir, work), indent=2) + "\n")
    except OSError as exc:
        raise BadInput(f"--work: {work}: {exc.strerror or exc}") from None
    return path


def known_machine() -> bool:
    """Whether asv's machine file (~/.asv-machine.json) describes this host already: kept as the user wrote it."""
    from asv import util
    from asv.machine import Machine, MachineCollection

    try:
        MachineCollection.load(Machine.get_unique_machine_name())
    except util.UserError:
        return False
    return True


def gate(args: argparse.Namespace, extra: list[str], repo: Path, folder: str) -> int:
    """asv continuous BASE HEAD through ci/asv_gate.py, on the SGLang checkout."""
    try:
        import asv  # noqa: F401  (the runner's asv: machine file, environments, benchmarks)
    except ImportError:
        raise BadInput(f"{sys.executable} cannot import asv, which the gate runs (pip install 'asv>=0.6,<0.7', in the harness's "
                       "test extra); --json OUT COMMIT needs no asv") from None
    base, head = (resolve(repo, what, ref) for what, ref in (("BASE", args.commits[0]), ("HEAD", args.commits[1])))
    subdirs = {project_subdir(repo, c, ref, folder) for c, ref in ((base, args.commits[0]), (head, args.commits[1]))}
    if len(subdirs) != 1:
        raise BadInput(f"BASE and HEAD keep SGLang's project in different folders ({sorted(subdirs)}) in {repo}")
    if base == head:  # asv_gate refuses it too, but after the configuration and the machine file are written
        raise BadInput(f"HEAD {args.commits[1]!r} is the same commit as BASE {args.commits[0]!r} ({base[:12]}): the gate needs two")
    config = write_config(repo, subdirs.pop(), args.work)
    for name, value in BUILD_ENV.items():  # asv's install_command inherits this environment
        os.environ.setdefault(name, value)
    if "MLA_ASV_STRATEGIES" not in os.environ:
        os.environ["MLA_ASV_STRATEGIES"] = ",".join(sglang_strategies())
        for reason in left_out():
            print(f"sglang-gate: left out: {reason}", flush=True)
    os.environ.setdefault("MLA_ASV_SCENARIOS", DEFAULT_SCENARIOS)
    os.chdir(ROOT)  # asv imports the ".ci.asv_sglang_env" plugin from the working directory

    machine = ["--machine", args.machine] if args.machine else []
    if machine or not known_machine():  # without --machine, `asv machine --yes` rewrites a described host with its guesses
        subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", *machine, "--config", str(config)],
                       check=True, stdout=subprocess.DEVNULL)  # this machine's description, as asv records it

    gate_args = [base, head, "--factor", f"{args.factor:g}", *(["--bench", args.bench] if args.bench else []),
                 *machine, "--config", str(config), *extra]
    print(f"sglang-gate: {repo} {args.commits[0]} ({base[:8]}) -> {args.commits[1]} ({head[:8]}), "
          f"strategies {os.environ['MLA_ASV_STRATEGIES']}, scenarios {os.environ['MLA_ASV_SCENARIOS']}", flush=True)
    return asv_gate.main(gate_args)


def install_commit(repo: Path, commit: str, subdir: str, into: Path) -> tuple[Path, str]:
    """`pip install --no-deps` of one commit's SGLang project into the folder `into`/site, built as SGLang builds it:
    from a checkout of the commit with its history and tags (a clone sharing the repository's objects; SGLang's
    setuptools-scm version is `git describe` of the commit, "0.0.0.dev0" without .git), Rust extensions off
    (BUILD_ENV), pip's own temporary folders in `into`/tmp (TMPDIR), so those an interrupted pip leaves go with `into`.
    (site, the version pip installed)."""
    src, site, tmp = into / "src", into / "site", into / "tmp"
    # the fetch: a shallow repository is cloned by fetching its branches and tags only (no shared objects), so a
    # commit on another ref (a remote-tracking branch of a CI checkout) is fetched by its hash
    for step, cmd in (("clone", ["clone", "--quiet", "--shared", "--no-checkout", str(repo), str(src)]),
                      ("fetch", ["-C", str(src), "fetch", "--quiet", "--no-tags", "--update-shallow", str(repo), commit]),
                      ("checkout", ["-C", str(src), "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit])):
        if subprocess.run(["git", *cmd]).returncode != 0:  # git's own error is above this line
            raise BadInput(f"COMMIT {commit[:12]}: git {step} of {repo} failed; nothing was run")
    cmd = [sys.executable, *INSTALL.split()[1:], "--target", str(site), str(src / subdir)]
    tmp.mkdir()
    if subprocess.run(cmd, env={**BUILD_ENV, **os.environ, "TMPDIR": str(tmp)}).returncode != 0:  # pip's own error is above this line
        raise BadInput(f"COMMIT {commit[:12]}: pip could not install its SGLang project ({subdir or '.'}); nothing was run")
    versions = [d.name[len("sglang-"):-len(".dist-info")] for d in site.glob("sglang-*.dist-info")]
    return site, versions[0] if len(versions) == 1 else "unknown"


def run_parser() -> argparse.ArgumentParser:
    """`harness run`'s arguments, read as it reads them."""
    from harness.cli import run as run_cli

    parser = argparse.ArgumentParser(prog="python -m harness run", allow_abbrev=False)
    run_cli.add_arguments(parser)
    return parser


def absolute_paths(extra: list[str]) -> list[str]:
    """`extra` with the value of each path option of `harness run` (`--opt v`, `--opt=v`) joined to the current folder:
    the child runs in the harness checkout, and must read and write the files the user named."""
    options = {name for action in run_parser()._actions if action.type is Path for name in action.option_strings}
    out, value_next = [], False
    for word in extra:
        name, eq, value = word.partition("=")
        out.append(_joined(word) if value_next else f"{name}={_joined(value)}" if eq and name in options else word)
        value_next = not value_next and word in options
    return out


def _joined(path: str) -> str:
    """`path` from the current folder; joined, not resolved: /dev/stdout stays the stream the child inherits, and
    `link/../x` names x beside the link's target, as it did here."""
    return os.path.join(os.getcwd(), path)


def check_out(out: Path, extra: list[str], repo: Path) -> None:
    """The checks `harness run --json OUT` makes (harness/cli/run.py), before the install (the child writes a private
    file, which the gate copies to OUT): OUT is none of its inputs (the --scenario-file, the harness's own files, a golden
    file), not inside a golden folder (--golden-dir's too), not the --dump-outputs folder or a dump there, and writable;
    neither OUT nor the --dump-outputs folder lies inside the SGLang checkout `repo`."""
    from types import SimpleNamespace

    from harness.cli.common import inputs_of
    from harness.inputs.cases import refuse_clobbering, use_golden_dir

    given, _ = run_parser().parse_known_args(extra)
    refuse_inside_checkout(repo, [("--json", out), ("--dump-outputs", given.dump_outputs)])
    use_golden_dir(given.golden_dir)
    try:
        refuse_clobbering([("--json", out)], inputs_of(SimpleNamespace(scenario=SimpleNamespace(source=given.scenario_file))))
    finally:
        use_golden_dir(None)  # the gate reads no golden itself: nothing of this check stays set in the process
    real, dumps = os.path.realpath(out), given.dump_outputs and os.path.realpath(given.dump_outputs)
    if dumps and (real == dumps or (os.path.dirname(real) == dumps and real.endswith(".safetensors"))):
        raise BadInput(f"--json: {out} is the --dump-outputs folder or one of its dumps: the run's outputs must not overlap")
    try:
        check_writable(out, "--json", force=given.force)
    except HarnessError as exc:
        raise BadInput(f"{exc} (harness run's --force goes after --)") from None


def run_harness(cmd: list[str], **kwargs) -> int:
    """`harness run`'s exit status. Interrupted (Ctrl-C or SIGTERM, passed on to it: `asv_gate.run_supervised`), the child
    unwinds as its own interruptible main does (temporary files go, 'interrupted', 130) and is stopped and waited for
    before the caller's temporary folder goes; its 130 is returned, else the interruption goes on."""
    return asv_gate.run_supervised(cmd, **kwargs)


def json_run(args: argparse.Namespace, extra: list[str], repo: Path, folder: str) -> int:
    """`harness run --json OUT` with one commit's SGLang installed in front of the runner's packages."""
    (ref,) = args.commits
    check_out(args.json, extra, repo)
    from harness.cli import writes_stdout

    console = sys.stderr if writes_stdout(args) else sys.stdout  # --json /dev/stdout: the results alone go there
    commit = resolve(repo, "COMMIT", ref)
    subdir = project_subdir(repo, commit, ref, folder)
    if not any(a == "--strategy" or a.startswith("--strategy=") for a in extra):
        extra = [*extra, *(x for s in sglang_strategies() for x in ("--strategy", s))]
    with tempfile.TemporaryDirectory(prefix="sglang-gate-") as tmp:
        site, version = install_commit(repo, commit, subdir, Path(tmp))
        # the child runs in the harness checkout: the path variables set (MLA_HARNESS_GOLDEN_DIR) and PYTHONPATH name
        # what they name here
        paths = {v.name: _joined(os.environ[v.name]) for v in envvars.VARIABLES if v.kind == "path" and os.environ.get(v.name)}
        python_path = [str(site), str(ROOT), *(_joined(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        env = dict(os.environ, **paths, PYTHONPATH=os.pathsep.join(python_path),
                   MLA_HARNESS_SGLANG_COMMIT=commit)  # the results say which SGLang commit ran (installed without .git)
        # the results go to a private file, checked there and then copied to OUT: a stream is never read back
        results = Path(tmp) / "results.json"
        cmd = [sys.executable, "-m", "harness", "run", "--json", str(results), *absolute_paths(extra)]
        print(f"sglang-gate: {repo} {ref} ({commit[:8]}) installed in {site} (sglang {version}); running {' '.join(cmd[1:])}",
              file=console, flush=True)
        code = run_harness(cmd, cwd=ROOT, env=env, stdout=None if console is sys.stdout else sys.stderr)
        if code == 130 or not results.exists():  # interrupted, or nothing written: OUT is left as it was
            if code == 0:  # a run that ended early (an SGLang calling sys.exit(0))
                print(f"sglang-gate: FAILURE: harness run exited 0 without writing {args.json}", file=sys.stderr)
                return 1
            return code
        why = unchecked_sglang(results) if code == 0 else None
        doc = json.loads(results.read_bytes())  # the child's repro names this private file and install: the gate's instead
        doc["repro"] = gate_repro(repo, commit, args.json, extra)
        write_bytes(args.json, (json.dumps(doc, indent=1) + "\n").encode(), "--json")  # check_out found it free (or --force)
    if why:
        print(f"sglang-gate: FAILURE: {args.json}: {ref} ({commit[:8]}): {why}", file=sys.stderr)
        return BAD_INPUT
    return code


def gate_repro(repo: Path, commit: str, out: Path, extra: list[str]) -> str:
    """The command that writes these results again: this gate on the same commit (its full hash) from this checkout,
    its variables as a run's repro sets them (harness.results.document.repro_env)."""
    from harness.results.document import repro_env

    command = [sys.executable, "-m", "ci.sglang_gate", "--sglang-repo", os.path.abspath(repo), "--json", os.path.abspath(out),
               commit, "--", *absolute_paths(extra)]
    return " ".join(["cd", shlex.quote(str(ROOT)), "&&", *repro_env([str(ROOT)]), shlex.join(command)])


def unchecked_sglang(path: Path) -> str | None:
    """Why the results at `path` check none of the commit's SGLang (`unchecked`), or None when one was checked."""
    from harness.results.schema import read_results

    try:
        rows = read_results(path).rows
    except HarnessError as exc:
        return f"harness run wrote results no reader takes ({exc})"
    return unchecked({r.strategy: (r.value, (r.detail or {}).get("reason")) for r in rows if r.metric == "verdict"})


def unchecked(verdicts: dict[str, tuple[str, str | None]]) -> str | None:
    """Why `verdicts` ({strategy: (status, reason)} of one case) check none of the commit's SGLang (each SGLang-backed
    strategy's status and reason when unsupported: e.g. a dependency the user's patch imports is missing), or None when one
    passed, failed or errored. The harness's own strategies passing alone gate no SGLang code."""
    from harness.strategies import REGISTRY

    sglang = {s: v for s, v in verdicts.items() if getattr(REGISTRY.get(s), "runs_sglang", False)}
    if any(status in ("pass", "fail", "error") for status, _ in sglang.values()):
        return None
    if not sglang:
        return "no SGLang-backed strategy was run (none was named)"
    return "no SGLang-backed strategy ran: " + "; ".join(f"{s} {status}: {reason}" for s, (status, reason) in sglang.items())


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage first)
        self.exit(BAD_INPUT, f"sglang-gate: {message}\n")


def bench_arg(text: str) -> str:
    """--bench as asv reads it: a Python regex (else asv fails only after building both commits)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({exc})") from None
    return text


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = _Parser(prog="python -m ci.sglang_gate", description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-repo", help="your SGLang git checkout (default: $MLA_SGLANG_REPO)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="run `harness run --json OUT` for ONE commit instead of the gate")
    parser.add_argument("--factor", type=asv_gate.factor_arg, help="the asv gate's factor, in (1, 2) (default 1.05; 5%% is 1.05)")
    parser.add_argument("--bench", type=bench_arg, help="regex selecting asv benchmarks")
    parser.add_argument("--machine", help="asv machine name")
    parser.add_argument("--work", type=Path, help="asv's configuration, environments and results: a new or empty folder, "
                                                  "or one the gate made (default .asv/sglang)")
    parser.add_argument("commits", nargs="+", metavar="COMMIT", help="BASE HEAD (gate), or COMMIT (--json)")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1:]
    want = 1 if args.json else 2
    if len(args.commits) != want:
        parser.error(f"{'--json takes one COMMIT' if args.json else 'the gate takes BASE and HEAD'}, got {len(args.commits)}")
    if args.json and (given := [f"--{n}" for n in ("factor", "bench", "machine", "work") if getattr(args, n) is not None]):
        parser.error(f"{given[0]} is an option of the gate (BASE HEAD), not of --json")
    args.factor = 1.05 if args.factor is None else args.factor
    args.work = DEFAULT_WORK if args.work is None else args.work
    return args, extra


@interruptible
def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    try:
        repo, folder = check_repo(args.sglang_repo or envvars.read("MLA_SGLANG_REPO"))
        return (json_run if args.json else gate)(args, extra, repo, folder)
    except (BadInput, HarnessError) as exc:
        print(f"sglang-gate: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
