#!/usr/bin/env python3
"""Perf gate around `asv continuous BASE HEAD`: 0 clean, 1 regression, 2 failure (or bad --factor).

usage: python -m ci.asv_gate BASE HEAD [--factor 1.05] [--bench REGEX] [--machine NAME] [--inconclusive pass|fail]
                              [--allow-dropped NAME[,NAME...]] [ASV ARGS...]

The factor is asv's, in (1, 2): 1.05 (the default, harness compare's 5% tolerance) flags a
benchmark that got more than 5% slower (asv also requires the change to be
statistically significant); "5%" is accepted as a synonym. Only benchmarks of gating metrics
(harness/results/metrics.py) fail the gate, and only by more than the metric's resolution;
informational ones (host time) are listed. Unknown options go to asv unchanged. The full asv output
is streamed through, then one `asv-gate:` line gives the verdict.

How asv 0.6.6 signals the outcome (asv/commands/continuous.py, run.py, main.py):
- a benchmark failed in either commit: `asv run` returns 2, printing
  `[ NN%] ··· name   failed` (or `k/n failed` for parameterised ones), and
  continuous returns that 2 before comparing, so no table and no summary;
- otherwise it prints the comparison table (`| + | ...` rows got worse,
  `| ! |` rows newly failing, `| - |` improved) and one summary:
  "PERFORMANCE DECREASED." (exit status 1: continuous returns worsened=True),
  "PERFORMANCE INCREASED." or "BENCHMARKS NOT SIGNIFICANTLY CHANGED." (exit 0);
- a user error (unknown commit, build failure, no results) or a crash also
  exits 1, but without a summary line, so the gate reads that as a failure;
- a benchmark that vanished from the head, or was skipped there (n/a), is not even listed
  (`continuous` shows changed rows only), so after asv's verdict the gate reads both commits'
  stored results (of one machine, one entry per environment both commits were measured in, named as asv names its
  rows: `name [machine/env]` with several; only this run's: the benchmarks in the results folder's benchmarks.json, of
  the version stored there, as a results file keeps earlier runs' entries): a benchmark the base has and the head lacks, one that failed in the
  head, or one the base measured that is n/a in the head, is a failure (exit 2) however asv worded it; one n/a at both commits is
  listed, not failed, unless nothing was measured at both; unreadable or absent results fail too, and so does
  a results file asv would not read (a renamed copy, another machine's) or a value or sample asv could not have
  written (no number, or a sample the harness rule cannot take a ratio of), named with its file and benchmark;
- a row marked `x` (asv cannot compare: the benchmark's code or parameters changed) is a failure, and so
  is "PERFORMANCE DECREASED." with no row the gate could read;
- a benchmark of the `verdict` metric (the SGLang gate's `Verdict.track_verdict`: 0 pass, 1 fail) at 1 in
  the head fails the gate (exit 1) whatever the base had: asv calls 1 -> 1 unchanged;
- BASE and HEAD naming one commit are refused before asv runs (one commit's results always pass), and so is a
  HEAD that no longer benchmarks a strategy BASE does (removed, or registered with benchmark=False: asv would time
  neither commit's, and its slowdown would go unjudged) unless --allow-dropped names it.

Ctrl-C or SIGTERM (a cancelled job) stops asv and every process it started (asv runs in a session of its own, killed
whole, since it starts each benchmark in a process group of its own), says 'interrupted' and exits 130.

The harness's rule beside asv's (`harness_rule`): every gating benchmark with at least MIN_SAMPLES recorded
samples at both commits is also judged by `harness compare`'s decision rule (harness/gate/decision.py: a 99%
bootstrap interval on the ratio of medians, tolerance factor - 1), and that rule decides it, as it decides
`harness compare`: `regressed` fails the gate, also where asv called it unchanged (asv's test misses real
slowdowns: docs/evidence/gate/gate-noise.md); `inconclusive` prints a loud INCONCLUSIVE line and fails only
with `--inconclusive fail`; anything else passes, and a row asv flagged is then listed as cleared (asv's test
cries wolf on two-state clocks). Benchmarks with fewer samples, and `track_` ones, keep asv's verdict, unless
asv's test cannot flag them either (NO_TEST: 3 samples against 30, say): then the gate cannot judge (exit 2).

Which test decided (asv/commands/compare.py `_is_result_better`, asv/_stats.py
`is_different`): when both commits have stats from more than one repeat, asv first
requires a significant difference: a Mann-Whitney U test (p < 0.002) on the recorded
samples (`asv continuous` records them by default) when there are enough for the test
to reach that p, else non-overlapping 99% confidence intervals; only then the factor.
A benchmark with one value per commit (a `track_` benchmark, or repeat = 1) is judged
by the factor alone. After asv's verdict the gate reads both commits' asv results and
prints, per benchmark, which of these decided (`asv-gate: decided by ...`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ci import shared_strategies
from harness import envvars
from harness.datafiles import read_json, read_text
from harness.errors import HarnessError, interruptible

CLEAN, REGRESSION, FAILURE = 0, 1, 2
DECREASED = "PERFORMANCE DECREASED."
SUMMARIES = (DECREASED, "PERFORMANCE INCREASED.", "BENCHMARKS NOT SIGNIFICANTLY CHANGED.")
LOST_VALUES = ("failed", "n/a")  # how asv prints a value the head did not produce
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FAILED_LINE = re.compile(r"^(?:\[\s*[\d.]+%\]\s+)?·+\s+(?P<name>.+?)\s+(?:\d+/\d+\s+)?failed$")
GRACE_S = 5  # how long an interrupted child may take to unwind before the next, harder signal
T = TypeVar("T")


@dataclass
class Outcome:
    code: int
    reason: str
    regressions: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    informational: list[str] = field(default_factory=list)  # slower, but not gating (metric table)
    inconclusive: list[str] = field(default_factory=list)  # the harness rule's interval straddles the factor
    cleared: list[str] = field(default_factory=list)  # asv flagged them; the harness rule's interval lies below the factor


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of asv's github-format comparison rows: change, before, after, ratio, benchmark (a `|` in a
    benchmark's parameters stays in its name)."""
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 5 and cells[0] in ("+", "-", "!", "x", "*", ""):
            rows.append([*cells[:4], "|".join(cells[4:]).strip()])
    return rows


TIME_UNITS = {"ns": 1e-9, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
ASV_VALUE = re.compile(r"^(?P<value>[0-9.]+(?:e[-+]?\d+)?)(?:±[0-9.]+(?:e[-+]?\d+)?)?(?P<unit>ns|μs|us|ms|s)$")


def _seconds(cell: str) -> float | None:
    """asv's printed time ('2.23±0.08μs') in seconds; None for anything else."""
    m = ASV_VALUE.match(cell.strip())
    return float(m["value"]) * TIME_UNITS[m["unit"]] if m else None


def metric_of(benchmark: str) -> str:
    """The metric a benchmark measures, from its class name (suites/asv/benchmarks.py names each class
    after its `metric`): `benchmarks.StepHostMs.time_step_host(...)` -> step_host_ms; '' without one."""
    parts = benchmark.split("(")[0].split(".")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", parts[-2]).lower() if len(parts) >= 2 else ""


def gates(row: list[str]) -> bool:
    """Whether a regressed comparison row (change, before, after, ratio, benchmark) fails the gate, by
    the metric table: the benchmark class names the metric (`benchmarks.StepHostMs.time_step_host(...)`
    -> step_host_ms); an informational metric never gates, nor does a change smaller than the metric's
    resolution (0.5 us for microsecond kernels, as in `harness compare`). Unknown benchmarks gate."""
    from harness.results.metrics import METRICS

    metric = METRICS.get(metric_of(row[4]))
    if metric is None:
        return True
    if not metric.gates("cuda"):
        return False
    before, after = _seconds(row[1]), _seconds(row[2])
    if metric.resolution and before is not None and after is not None and metric.unit in TIME_UNITS:
        return round((after - before) / TIME_UNITS[metric.unit], 9) >= metric.resolution  # printed values: no float residue
    return True


def classify(returncode: int, output: str) -> Outcome:
    """Read `asv continuous` output and exit status (asv 0.6.x) into the gate's verdict. A benchmark
    of an informational metric (step_ms, step_host_ms: host time), or slower by less than its metric's
    resolution, is reported, never gating; a row n/a at both commits (`--no-only-changed` lists it) is no failure."""
    lines = [ANSI.sub("", line).rstrip() for line in output.splitlines()]
    rows = _table_rows(lines)
    failures = [m["name"] for m in map(FAILED_LINE.match, lines) if m]
    failures += [f"{r[4]} (newly failing)" for r in rows if r[0] == "!"]
    failures += [f"{r[4]} ({r[2]} in the head)" for r in rows if r[0] != "!" and r[2] in LOST_VALUES and r[1:3] != ["n/a", "n/a"]]
    failures += [f"{r[4]} (not comparable: its code or parameters changed between the commits)" for r in rows if r[0] == "x"]
    describe = lambda r: f"{r[4]} ({r[1]} -> {r[2]}, ratio {r[3]})"  # noqa: E731
    regressions = [describe(r) for r in rows if r[0] == "+"]
    gating = [describe(r) for r in rows if r[0] == "+" and gates(r)]
    summary = next((line.strip() for line in reversed(lines) if line.strip() in SUMMARIES), None)
    if failures or returncode == 2:
        return Outcome(FAILURE, "benchmarks failed", regressions, failures)
    if summary is None:
        return Outcome(FAILURE, "asv printed no comparison (crashed or bad input)")
    if gating:
        return Outcome(REGRESSION, "performance decreased beyond the factor", gating,
                       informational=[r for r in regressions if r not in gating])
    if summary == DECREASED and not regressions:
        return Outcome(FAILURE, "asv reported a decrease in no row the gate could read")
    if regressions:  # only informational metrics got slower: reported, never failing
        return Outcome(CLEAN, "only informational benchmarks, or changes below a metric's resolution, slower",
                       informational=regressions)
    if returncode != 0:
        return Outcome(FAILURE, f"asv exited non-zero although it reported {summary!r}")
    return Outcome(CLEAN, summary)


MANN_WHITNEY, CI_OVERLAP, FACTOR_ONLY = ("Mann-Whitney U (p < 0.002) on recorded samples, then the factor",
                                         "non-overlapping 99% CIs of asv's stats, then the factor",
                                         "the factor alone (one value per commit: no spread to test)")
NO_TEST = "none: Mann-Whitney U cannot reach p < 0.002 with these sample counts, so asv flags no slowdown"
P_THRESHOLD = 0.002  # asv's is_different


def deciding_test(base: tuple, head: tuple) -> str:
    """Which test asv 0.6 applies to one benchmark; base/head are its (stats, samples) per commit. asv picks Mann-Whitney
    U when its exact test's smallest p is below the threshold, but past 20 samples at a commit it computes p by the
    normal approximation, whose smallest p can stay above it (3 samples against 30: 0.0048): NO_TEST, a benchmark asv
    calls unchanged however much slower."""
    from asv._stats import mann_whitney_u

    (stats_a, samples_a), (stats_b, samples_b) = base, head
    if not (stats_a and stats_b) or 1 in (stats_a.get("repeat", 0), stats_b.get("repeat", 0)):
        return FACTOR_ONLY
    if samples_a and samples_b and 1 / math.comb(len(samples_a) + len(samples_b), min(len(samples_a), len(samples_b))) < P_THRESHOLD:
        # asv's p_min check passed: the test decides, if it can reach the threshold at all (two samples apart)
        _, p = mann_whitney_u([0.0] * len(samples_a), [1.0] * len(samples_b))
        return MANN_WHITNEY if p < P_THRESHOLD else NO_TEST
    return CI_OVERLAP


def _results_file(path: Path, machine: str) -> dict:
    """One stored asv results file, checked as asv's Results.load would read it: an object named as asv names it
    (asv.results.get_filename: a renamed copy is no result of that environment) of `machine`."""
    from asv.results import get_filename

    doc = read_json(path)
    if not isinstance(doc, dict):
        raise HarnessError(str(path), "not an asv results object")
    for name, kind in (("commit_hash", str), ("env_name", str), ("result_columns", list), ("results", dict)):
        if not isinstance(doc.get(name), kind):
            raise HarnessError(f"{path}: {name}", f"missing or not a {kind.__name__}")
    if path.name != (name := Path(get_filename(machine, doc["commit_hash"], doc["env_name"])).name):
        raise HarnessError(str(path), f"holds {name}'s results under another name "
                                      "(a copy asv does not read): move it out of the results folder")
    recorded = doc["params"].get("machine") if isinstance(doc.get("params"), dict) else None
    if recorded is not None and recorded != machine:
        raise HarnessError(f"{path}: params.machine", f"{recorded!r}, in the results folder of machine {machine!r}")
    return doc


def _checked(path: Path, name: str, value, samples) -> tuple:
    """(value, samples) of one benchmark, refused unless the value is None (failed), NaN (skipped) or a finite number
    (positive for a time_ benchmark), and the samples none or finite numbers, positive where the harness rule takes
    their ratio (`harness_rule`)."""
    from harness.gate.compare import is_number
    from harness.results.metrics import METRICS

    if value is not None and not (is_number(value) or _skipped(value)):
        raise HarnessError(f"{path}: results.{name}", f"value {value!r} is no number, failure (null) or skip (NaN)")
    if is_number(value) and value <= 0 and name.split("(")[0].split(".")[-1].startswith("time_"):
        raise HarnessError(f"{path}: results.{name}", f"value {value!r}: a time asv measured is positive")
    if samples is None:
        return value, samples
    metric = METRICS.get(metric_of(name))
    judged = metric is None or metric.gates("cuda")
    if not isinstance(samples, list) or not all(is_number(s) and (s > 0 or not judged) for s in samples):
        raise HarnessError(f"{path}: results.{name}.samples", f"{str(samples)[:80]}: not a list of finite"
                                                              f"{' positive' if judged else ''} numbers")
    return value, samples


def _this_run(results_dir: Path) -> dict[str, str]:
    """{benchmark: version} of the benchmarks the last asv run discovered: its results folder's benchmarks.json, which
    every `asv run` (and so `asv continuous`) writes."""
    path = results_dir / "benchmarks.json"
    doc = read_json(path)
    if not (isinstance(doc, dict) and all(isinstance(v, dict) for k, v in doc.items() if k != "version")):
        raise HarnessError(str(path), "not asv's benchmark list (an object of benchmark objects)")
    return {k: v.get("version") for k, v in doc.items() if k != "version"}


def _by_benchmark(results_dir: Path, machine: str, commit: str, timed: dict[str, str]) -> tuple[dict, set]:
    """({asv environment: {benchmark (with params, as asv names it): (value, stats, samples)}}, {(environment,
    benchmark) not compared}) from asv's stored results of one commit (results format 2: <machine>/<hash[:8]>-<env>.json,
    one column per field). An entry of a benchmark not in `timed` (`_this_run`), or of another version, is an earlier
    run's (asv's Results.load_data keeps every benchmark stored for the commit): not compared. A value is None when the
    benchmark failed, NaN when it was skipped. A file or entry asv could not have written (`_results_file`, `_checked`)
    is a HarnessError naming it."""
    out: dict[str, dict[str, tuple]] = {}
    stale = set()
    paths = [p for p in sorted(results_dir.glob(f"{machine}/{commit[:8]}-*.json")) if p.name != "machine.json"]
    for path in paths:
        doc = _results_file(path, machine)
        if doc["commit_hash"] != commit:
            continue
        entries = out.setdefault(doc["env_name"], {})
        for key, row in doc["results"].items():
            if not isinstance(row, list):
                raise HarnessError(f"{path}: results.{key}", "not a list of result_columns' values")
            entry = dict(zip(doc["result_columns"], row))
            if (key, entry.get("version")) not in timed.items():
                stale.add((doc["env_name"], key))
                continue
            params = entry.get("params") or []
            if not (isinstance(params, list) and all(isinstance(p, list) for p in params)):
                raise HarnessError(f"{path}: results.{key}.params", "not a list of parameter value lists")
            combos = list(itertools.product(*params)) or [()]
            result = entry.get("result")
            values = result if isinstance(result, list) else [result] * len(combos)
            repeats, samples = entry.get("stats_repeat") or [], entry.get("samples") or []
            if not (isinstance(repeats, list) and isinstance(samples, list)):
                raise HarnessError(f"{path}: results.{key}", "stats_repeat and samples are lists, one item per parameter combination")
            for i, combo in enumerate(combos):
                name = f"{key}({', '.join(map(str, combo))})" if combo else key
                repeat = repeats[i] if i < len(repeats) else None
                value, got = _checked(path, name, values[i] if i < len(values) else None, samples[i] if i < len(samples) else None)
                entries[name] = (value, {"repeat": repeat} if repeat is not None else None, got)
    return out, stale


def _config(path: Path) -> tuple[Path, dict]:
    """(the asv config's folder, the config) as asv reads it (JSON5: comments, trailing commas); one HarnessError
    naming the file when it is not a readable object with a string `repo`."""
    import json5  # asv's own config reader (an asv dependency): the gate's other users need no asv

    try:
        conf = json5.loads(read_text(path))  # bounded: --config /dev/zero is one line, not a full memory
    except ValueError as exc:
        raise HarnessError(str(path), f"not a readable asv config ({exc})") from None
    except RecursionError:
        raise HarnessError(str(path), "not a readable asv config (nested too deeply)") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("repo", "."), str):
        raise HarnessError(f"{path}: repo", "an asv config is an object whose repo is a path")
    if not (repo := path.parent / conf.get("repo", ".")).is_dir():
        raise HarnessError(f"{path}: repo", f"{repo} is not a folder")
    return path.parent, conf


def commit_hashes(base: str, head: str, config: tuple[Path, dict]) -> list[str]:
    """BASE and HEAD resolved in the repository of `config` (`_config`); one that is not a commit there
    is a HarnessError naming it (checked before asv runs)."""
    root, conf = config
    repo = root / conf.get("repo", ".")
    hashes = []
    for what, ref in (("BASE", base), ("HEAD", head)):
        proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=repo, capture_output=True, text=True)
        if proc.returncode:
            raise HarnessError(what, f"{ref!r} is not a commit of {repo.resolve()}")
        hashes.append(proc.stdout.strip())
    if hashes[0] == hashes[1]:  # asv would compare one commit's results with themselves: always "not changed"
        raise HarnessError("HEAD", f"{head!r} is the same commit as BASE {base!r} ({hashes[0][:12]}): the gate needs two commits")
    return hashes


def benchmarked_at(repo: Path, commit: str) -> tuple[list[str], bool] | None:
    """The strategies the asv benchmarks time by default with `commit`'s harness, and whether it declares them
    (ci.shared_strategies.listing, on the commit's harness/ folder unpacked in a temporary folder); None when the commit has no harness/ (another project's
    asv config, e.g. the SGLang gate's, which names its strategies itself)."""
    import tarfile
    import tempfile

    proc = subprocess.run(["git", "archive", "--format=tar", commit, "harness"], cwd=repo, capture_output=True)
    if proc.returncode:
        return None
    with tempfile.TemporaryDirectory(prefix="asv-gate-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # 3.11.4+
        try:
            return shared_strategies.listing(Path(tmp))
        except SystemExit as exc:
            raise HarnessError("MLA_ASV_STRATEGIES", f"cannot list the strategies {commit[:12]} benchmarks: {exc}") from None


def pin_strategies(hashes: list[str], config: tuple[Path, dict], allow_dropped: set[str] = frozenset()) -> str | None:
    """asv discovers the parameters at HEAD and runs the base's benchmarks by parameter index, so a head that adds,
    removes or reorders a benchmarked strategy would store the base's results of one strategy under another's name.
    Unless MLA_ASV_STRATEGIES is set, set it to the strategies both commits time, in the head's order (what the
    perf-gate workflow does with ci.shared_strategies); return the line saying so, or None when the lists agree.
    A strategy the base times and the head does not is refused (HarnessError) unless allow_dropped names it."""
    if "MLA_ASV_STRATEGIES" in os.environ:
        return None
    root, conf = config
    listings = [benchmarked_at(root / conf.get("repo", "."), h) for h in hashes]
    if None in listings or listings[0][0] == listings[1][0]:
        return None
    (base, declared), (head, _) = listings
    shared = [s for s in head if s in base]
    if not shared:
        raise HarnessError("MLA_ASV_STRATEGIES", f"BASE times {','.join(base)} and HEAD {','.join(head)}: no strategy in both")
    if why := shared_strategies.unjudged_drops(base, head, allow_dropped, declared):
        raise HarnessError("HEAD", why)
    os.environ["MLA_ASV_STRATEGIES"] = ",".join(shared)
    return (f"BASE times {','.join(base)}, HEAD {','.join(head)} (asv pairs them by index): "
            f"MLA_ASV_STRATEGIES={os.environ['MLA_ASV_STRATEGIES']}")


def stored_results(args: argparse.Namespace) -> tuple[dict, dict]:
    """Both commits' stored asv results of this run (`_by_benchmark`), found through the asv config, for the machine
    the run used: --machine, else the results folder's only machine (several: name one), and the benchmarks
    the run's --bench regexes select (as asv does: `name(params)` searched), if any."""
    root, conf = config = _config(args.config)
    hashes = commit_hashes(args.base, args.head, config)
    results_dir = root / conf.get("results_dir", "results")
    machines = sorted(p.name for p in results_dir.iterdir() if p.is_dir()) if results_dir.is_dir() else []
    machine = args.machine or (machines[0] if len(machines) == 1 else None)
    if machine is None:
        raise HarnessError("--machine", f"{results_dir} holds results of {len(machines)} machines: name the one this run used")
    timed = _this_run(results_dir)
    found, stale = zip(*(_by_benchmark(results_dir, machine, h, timed) for h in hashes))
    for what, ref, results in (("BASE", args.base, found[0]), ("HEAD", args.head, found[1])):
        if not results:
            raise HarnessError(what, f"no stored results of {ref!r} for machine {machine!r} in {results_dir}")
    # the environments this run measured both commits in (a file of one commit alone is an earlier run's), one
    # entry each, so a skip in one environment is not hidden by another
    envs = sorted(found[0].keys() & found[1].keys())
    if not envs:
        raise HarnessError("HEAD", f"no asv environment holds results of both {args.base!r} and {args.head!r} in {results_dir}")
    if earlier := sorted({key for env, key in stale[0] | stale[1] if env in envs}):
        print(f"asv-gate: not compared (an earlier run's results: not in this run's benchmarks.json, or of another version): "
              f"{len(earlier)} benchmark(s): {', '.join(earlier)}")
    # named as asv names a row (asv/commands/compare.py print_table): with several environments `name [machine/env]`
    named = (lambda name, env: f"{name} [{env}]") if len(envs) > 1 else (lambda name, env: name)
    # this run's benchmarks only: a results file keeps what earlier runs (other --bench) stored beside them
    chosen = lambda name: not args.bench or any(re.search(regex, name) for regex in args.bench)  # noqa: E731 (as asv selects)
    return tuple({named(n, f"{machine}/{e}"): v for e in envs for n, v in side[e].items() if chosen(n)} for side in found)


def _skipped(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def lost(base: dict, head: dict) -> list[str]:
    """Benchmarks the head lost, however asv words them (`asv continuous` does not even list a vanished
    or skipped one): one the base has that the head lacks, one that failed (None) in the head, or one the
    base measured that was skipped (NaN) in the head."""
    out = []
    for name in sorted(base.keys() | head.keys()):
        if name not in head:
            out.append(f"{name} (vanished: in the base's results, not in the head's)")
        elif head[name][0] is None:
            out.append(f"{name} (failed in the head)")
        elif _skipped(head[name][0]) and not (name in base and _skipped(base[name][0])):
            out.append(f"{name} (n/a in the head: skipped)")
    return out


def failing_verdicts(head: dict) -> list[str]:
    """Benchmarks of the `verdict` metric (the SGLang gate's `Verdict.track_verdict`: 0 pass, 1 fail or error) that do
    not pass in the head, whatever the base had: asv calls a verdict that failed at both commits unchanged."""
    return [f"{name} (the head's verdict does not pass)" for name, (value, *_) in sorted(head.items())
            if metric_of(name) == "verdict" and value is not None and not _skipped(value) and value != 0]


def unmeasured(base: dict, head: dict) -> list[str]:
    """Benchmarks n/a at both commits: this runner cannot run them, or their metric does not apply (a strategy
    with no per-step cast has no cast_us). Said, not lost: there is no result of either commit to lose."""
    return [n for n in sorted(base.keys() & head.keys()) if _skipped(base[n][0]) and _skipped(head[n][0])]


def measured(base: dict, head: dict) -> list[str]:
    """Benchmarks with a value at both commits (neither failed nor n/a): the ones compared."""
    return [n for n in sorted(base.keys() & head.keys()) if not any(v is None or _skipped(v) for v in (base[n][0], head[n][0]))]


def decided_by(base: dict, head: dict) -> dict[str, str]:
    """{benchmark: the test that decided it} for every benchmark both commits have results for."""
    return {name: deciding_test(base[name][1:], head[name][1:]) for name in sorted(base.keys() & head.keys())}


def _benchmark_of(item: str) -> str:
    """The benchmark an Outcome line is about ('name (before -> after, ratio r)' -> name)."""
    return item.split(" (")[0]


def _ruled_metric(name: str) -> bool:
    """Whether a benchmark's metric gates with a direction (an unknown one: yes, as in `gates`)."""
    from harness.results.metrics import METRICS

    metric = METRICS.get(metric_of(name))
    return metric is None or (metric.gates("cuda") and metric.better in ("lower", "higher"))


def untestable(base: dict, head: dict, rule: dict, tests: dict[str, str]) -> list[str]:
    """Gating benchmarks measured at both commits that neither the harness rule (too few samples) nor asv's test
    (NO_TEST) can judge: a slowdown of any size would pass."""
    return [f"{n} ({len(base[n][2])} vs {len(head[n][2])} samples)" for n in measured(base, head)
            if n not in rule and tests.get(n) == NO_TEST and _ruled_metric(n)]


def harness_rule(base: dict, head: dict, factor: float) -> dict:
    """{benchmark: `harness compare`'s Decision} on both commits' recorded samples, for every benchmark that gates
    (by the metric table; an unknown one gates, lower better, as in `gates`) with at least MIN_SAMPLES samples at
    each commit, at tolerance factor - 1 and the metric's resolution (samples are seconds, as asv stores times)."""
    from harness.gate.decision import MIN_SAMPLES, decide
    from harness.results.metrics import METRICS

    out = {}
    for name in sorted(base.keys() & head.keys()):
        metric, (a, b) = METRICS.get(metric_of(name)), (base[name][2], head[name][2])
        if not _ruled_metric(name):
            continue
        if not (a and b) or min(len(a), len(b)) < MIN_SAMPLES:
            continue
        better, resolution = ("lower", 0.0) if metric is None else (metric.better, metric.resolution * TIME_UNITS.get(metric.unit, 1.0))
        out[name] = decide(np.asarray(a, dtype=float), np.asarray(b, dtype=float), better, factor - 1.0, resolution=resolution)
    return out


def judged(outcome: Outcome, rule: dict, inconclusive: str) -> Outcome:
    """asv's verdict, with `harness_rule` deciding every benchmark it covers (see the module doc): `regressed`
    fails, `inconclusive` is listed (failing only with --inconclusive fail), and an asv regression the rule does
    not confirm is cleared or listed as inconclusive; benchmarks the rule does not cover keep asv's verdict."""
    from harness.gate.decision import INCONCLUSIVE, REGRESSED

    def said(name, d):
        interval = f" [{d.low:.3f}, {d.high:.3f}]" if d.low is not None else ""
        mde = f", MDE {d.mde:.1%}" if d.mde is not None else ""
        return f"{name} (harness rule: {d.status}, ratio {d.ratio:.3f}{interval}{mde}{f', {d.note}' if d.note else ''})"

    flagged = {_benchmark_of(item): item for item in outcome.regressions}
    regressions = [item for name, item in flagged.items() if name not in rule]
    regressions += [f"{flagged.get(name, name)}; {said(name, d)}" for name, d in rule.items() if d.status == REGRESSED]
    unsure = [f"{flagged[name]}; {said(name, d)}" if name in flagged else said(name, d)
              for name, d in rule.items() if d.status == INCONCLUSIVE]
    cleared = [f"{item}; {said(name, rule[name])}" for name, item in flagged.items()
               if name in rule and rule[name].status not in (REGRESSED, INCONCLUSIVE)]
    kept = dict(informational=outcome.informational, inconclusive=unsure, cleared=cleared)
    if regressions:
        missed = any(name not in flagged for name, d in rule.items() if d.status == REGRESSED)
        return Outcome(REGRESSION, "the harness rule: slower beyond the factor (asv called some unchanged)" if missed
                       else outcome.reason, regressions, **kept)
    if unsure and inconclusive == "fail":
        return Outcome(REGRESSION, "inconclusive under --inconclusive fail: the samples cannot tell a slowdown beyond the factor",
                       **kept)
    reason = "asv's regressions are not confirmed by the harness rule" if flagged else outcome.reason
    return Outcome(CLEAN, reason, **kept)


def print_decided_by(tests: dict[str, str], outcome: Outcome) -> None:
    """One line per test used (with its benchmark count), and the test behind each regression."""
    for test in (MANN_WHITNEY, CI_OVERLAP, FACTOR_ONLY, NO_TEST):
        names = [n for n, t in tests.items() if t == test]
        if names:
            print(f"asv-gate: decided by {test}: {len(names)} benchmark(s)")
    for item in outcome.regressions:
        name = _benchmark_of(item)
        print(f"asv-gate:   {name}: {tests.get(name, 'unknown (no stored results)')}")


def check_stored(args: argparse.Namespace, outcome: Outcome) -> Outcome:
    """asv's verdict completed from both commits' stored results: a benchmark the head lost (`lost`)
    is a failure, and so are results the gate cannot read (it could not tell what vanished)."""
    try:
        base, head = stored_results(args)
    except Exception as exc:
        return Outcome(FAILURE, f"asv results not readable ({type(exc).__name__}: {exc}): cannot tell whether "
                                "a benchmark vanished", outcome.regressions)
    if missing := lost(base, head):
        return Outcome(FAILURE, "benchmarks lost in the head", outcome.regressions, missing)
    if failing := failing_verdicts(head):
        return Outcome(REGRESSION, "verdicts that do not pass in the head", outcome.regressions, failing)
    if neither := unmeasured(base, head):
        print(f"asv-gate: n/a at both commits (this runner cannot run them, or their metric does not apply): "
              f"{len(neither)} benchmark(s): {', '.join(neither)}")
    if not measured(base, head):
        return Outcome(FAILURE, "no benchmark was measured at both commits: nothing was judged", outcome.regressions)
    tests = decided_by(base, head)
    print_decided_by(tests, outcome)
    rule = harness_rule(base, head, args.factor)
    print(f"asv-gate: the harness rule (99% bootstrap interval, tolerance {args.factor - 1:.0%}) judged {len(rule)} benchmark(s)")
    if blind := untestable(base, head, rule, tests):
        from harness.gate.decision import MIN_SAMPLES

        return Outcome(FAILURE, f"cannot judge: too few samples at a commit for the harness rule (it needs {MIN_SAMPLES} at "
                                "each) and for asv's test: re-run both commits with as many repeats", outcome.regressions, blind)
    return judged(outcome, rule, args.inconclusive)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone (BSD: only zombies left)
        os.killpg(pgid, signum)


def _kill_session(sid: int) -> None:
    """SIGKILL to every process left in session `sid`, in whatever process group (asv runs each benchmark in one of its
    own), found in Linux's /proc (elsewhere only the signals to the child's own group reach anything)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        with contextlib.suppress(OSError):  # not a process, or gone meanwhile
            if entry.isdigit() and os.getsid(int(entry)) == sid:
                os.kill(int(entry), signal.SIGKILL)


def run_supervised(cmd: list[str], wait: Callable[[subprocess.Popen], T] = subprocess.Popen.wait, **popen) -> T | int:
    """wait(the child running `cmd`, started in a session of its own). Interrupted (Ctrl-C or SIGTERM, a cancelled job:
    either is passed on to the child's process group), the child may unwind as an interruptible main does (temporary
    files go, 'interrupted', 130) and is waited for (then SIGTERM, then SIGKILL to its group, each GRACE_S later); what
    is left of its session is killed. Its 130 is returned (it said 'interrupted'), else the interruption goes on."""
    with subprocess.Popen(cmd, start_new_session=True, **popen) as proc:
        stopping = False

        def forward(signum, frame):
            _signal_group(proc.pid, signum)
            if not stopping:
                raise KeyboardInterrupt

        previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            return wait(proc)
        except KeyboardInterrupt:
            stopping = True
            for signum in (None, signal.SIGTERM, signal.SIGKILL):
                if signum:
                    _signal_group(proc.pid, signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(GRACE_S)
                    break
            _kill_session(proc.pid)
            if proc.returncode == 130:
                return 130
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_streaming(cmd: list[str]) -> tuple[int, str]:
    """Run `cmd` (`run_supervised`: interrupted, asv and the benchmarks it started are stopped), echoing its combined
    output line by line; return (exit status, output)."""
    lines = []

    def echo(proc: subprocess.Popen) -> int:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        return proc.wait()

    returncode = run_supervised(cmd, echo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    return returncode, "".join(lines)


def factor_arg(text: str) -> float:
    """'1.10' or '10%' -> 1.10, which must lie in (1, 2): a slowdown factor, not a tolerance of 100% or more."""
    try:
        value = 1.0 + float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"factor must be a number in (1, 2) (e.g. 1.10 or 10%), got {text!r}") from None
    if not 1.0 < value < 2.0:
        raise argparse.ArgumentTypeError(f"factor must lie in (1, 2) (e.g. 1.10 or 10%), got {text!r}")
    return value


def asv_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "asv", "continuous", args.base, args.head, "--factor", f"{args.factor:g}",
           "--config", str(args.config)]
    for bench in args.bench or []:
        cmd += ["--bench", bench]
    if args.machine:
        cmd += ["--machine", args.machine]
    return cmd + extra


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The gate's own options, and the rest (passed to asv as is)."""
    parser = argparse.ArgumentParser(prog="python -m ci.asv_gate", description=__doc__.splitlines()[0])
    parser.add_argument("base", help="commit or ref to compare against, e.g. origin/main")
    parser.add_argument("head", help="commit or ref under test, e.g. HEAD")
    parser.add_argument("-f", "--factor", type=factor_arg, default=1.05,
                        help="asv factor (default 1.05, i.e. 5%%: harness compare's tolerance, so a real 10%% slowdown fails)")
    parser.add_argument("-b", "--bench", action="append", help="regex selecting benchmarks (repeatable: any of them, as asv)")
    parser.add_argument("-m", "--machine", help="asv machine name")
    parser.add_argument("--config", type=Path, default=Path("asv.conf.json"), help="asv config (default asv.conf.json)")
    parser.add_argument("--allow-dropped", type=lambda v: set(v.split(",")), default=set(), metavar="NAME[,NAME...]",
                        help="strategies the base benchmarks that the head deliberately no longer does (else: exit 2)")
    parser.add_argument("--inconclusive", choices=("pass", "fail"), default="pass",
                        help="a benchmark the harness rule finds inconclusive: pass (loud line, exit 0; the default) or fail (exit 1)")
    return parser.parse_known_args(argv)  # asv's spellings of these (-f, a prefix, a repeat) are the gate's: asv gets one


@interruptible
def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    try:  # a bad MLA_ASV_* value or commit fails here, not as a traceback inside every benchmark
        envvars.check_all()
        hashes = commit_hashes(args.base, args.head, config := _config(args.config))
        pinned = pin_strategies(hashes, config, args.allow_dropped)
    except (HarnessError, OSError, ValueError) as exc:
        print(f"asv-gate: FAILURE: {exc}", flush=True)
        return FAILURE
    if pinned:
        print(f"asv-gate: {pinned}", flush=True)
    cmd = asv_command(args, extra)
    print("asv-gate: running " + " ".join(cmd), flush=True)
    try:
        returncode, output = run_streaming(cmd)
    except OSError as exc:
        print(f"asv-gate: FAILURE: cannot run asv: {exc}", flush=True)
        return FAILURE
    outcome = classify(returncode, output)
    if outcome.code != FAILURE:
        outcome = check_stored(args, outcome)
    label = {CLEAN: "OK", REGRESSION: "REGRESSION", FAILURE: "FAILURE"}[outcome.code]
    print(f"\nasv-gate: {label}: {outcome.reason} (asv exit {returncode}, factor {args.factor:g})")
    for item in outcome.regressions:
        print(f"asv-gate:   slower: {item}")
    for item in outcome.failures:
        print(f"asv-gate:   failed: {item}")
    for item in outcome.informational:
        print(f"asv-gate:   slower (not gating: informational metric or below its resolution): {item}")
    for item in outcome.inconclusive:
        print(f"asv-gate:   INCONCLUSIVE (the samples cannot tell a slowdown beyond the factor; --inconclusive "
              f"{args.inconclusive}): {item}")
    for item in outcome.cleared:
        print(f"asv-gate:   cleared (asv flagged it; within the factor by the harness rule): {item}")
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
