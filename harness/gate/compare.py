"""Compare two results files (base vs head) of the same case and gate on regressions.

Only like with like: both files must carry the same case record (schema.Case: command, preset,
scenario, scale, slots, layers, backend, kernel, workload, workload_v4) and the same device type; a different case is
bad input (exit 2, naming the field), a different device "cannot judge" (exit 2), either way round.
A file whose environment.device is absent or neither cpu nor cuda is bad input when it holds a
timed metric that gates somewhere (its timings cannot be gated without the device).

Each row is judged by its metric's declaration (harness/results/metrics.py):
- timed metrics by the decision rule of harness/gate/decision.py (a 99% bootstrap interval on the
  ratio of medians; `inconclusive` with its minimum detectable change when it straddles the
  tolerance); a row whose timing block the clock guard (harness/measure/clocks.py) marked, on either
  side, is `disturbed`, not compared (a throttled or shared GPU's numbers are no measurement, whichever
  way they point); one with fewer than decision.MIN_SAMPLES samples on either side is `undersampled`;
- exact metrics (bytes) by the tolerance alone;
- a gating timing the head measured, of a strategy the base passed but whose timing failed (its `timing` row), is
  `no base value`: nothing to judge it against (exit 2);
- verdicts: a head that fails or errors is `failing`, also when the base has no such row; `pass`, `fail` or
  `error` -> `unsupported` is `failing` unless the head's environment differs in a field that explains it (ENV_EXPLAINS):
  then `unsupported`, a result the head could not give, which the gate cannot judge (exit 2), never a pass.
Every gating row of the base must be in the head with a value, else it is `missing` (`unsupported`
when its strategy's verdict is an explained `unsupported`); so must every strategy of the base, gating or
not: one with no row in the head is `missing` on any device (the control row is the environment guard's).
Only gating metrics (gating on the files' device type) fail the gate; an informational metric
that got worse is `worse`, never `regressed`.

Environment guard: when the two files' controls (control_copy_gbps) differ (the rule's interval clears 1 and
reaches past the tolerance, either way: a copy bandwidth shifted by no one knows how much up to beyond the tolerance
moves every timing with it) or have too few samples for the rule, only one file has a control, or the GPU differs or
is named in one file only, timed gating metrics cannot be judged.

Exit codes: 1 when a verdict fails (on any device, in any environment); 2 when the devices differ;
1 when an exact metric fails or a gating row is missing; 2 "cannot judge" when the environments
differ and timed gating metrics are present; 1 when a timed gating metric regressed; 2 "cannot
judge" when one is undersampled, disturbed or has no base value, or a strategy the base ran is unsupported in the
head's environment; 1 when one is inconclusive under --inconclusive fail;
else 0. Bad input (unreadable file, schema, case, unit, a file with no rows or none valued but the control, one run
given twice): 2 with one `error:` line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import envvars
from harness.errors import HarnessError
from harness.gate import decision
from harness.results.metrics import METRICS
from harness.results.schema import CASE_FIELDS, Environment, ResultsFile, Row, parse_results, read_results
from harness.spec.gpus import gpu_key

REGRESSED, FAILING, MISSING, WORSE = decision.REGRESSED, "failing", "missing", "worse"
FAILED = (REGRESSED, FAILING, MISSING)  # statuses that fail the gate when the row gates
DISTURBED = "disturbed"
NO_BASE = "no base value"  # a gating timing of a strategy the base passed but failed to time
BAD_VERDICTS = ("fail", "error")
CONTROL = "control_copy_gbps"
ENV_EXPLAINS = ("gpu", "capability", "cuda", "torch", "flashinfer", "triton_interpret")  # may make a strategy unsupported
INCONCLUSIVE_POLICIES = ("pass", "fail")
DEVICE_TYPES = ("cpu", "cuda")
STATUS_STYLE = {
    REGRESSED: "bold red",
    FAILING: "bold red",
    MISSING: "bold red",
    decision.INCONCLUSIVE: "bold yellow",
    decision.UNDERSAMPLED: "bold yellow",
    DISTURBED: "bold yellow",
    NO_BASE: "bold yellow",
    decision.SLOWER: "yellow",
    WORSE: "yellow",
    decision.IMPROVED: "green",
    "fixed": "green",
    "changed": "yellow",
    "unsupported": "yellow",
    "undeclared": "yellow",
    "added": "cyan",
}


@dataclass(frozen=True)
class Change:
    """One row key as seen on both sides; base/head are the rows or None."""

    key: tuple
    base: Row | None
    head: Row | None
    status: str  # regressed, failing, missing, inconclusive, disturbed, slower, worse, improved, unchanged, ...
    ratio: float | None = None
    decision: decision.Decision | None = None  # timed metrics: the interval behind the status
    gating: bool = False
    note: str = ""

    @property
    def timed(self) -> bool:
        return self.key[5] in METRICS and METRICS[self.key[5]].timed


@dataclass(frozen=True)
class Comparison:
    changes: list[Change]
    max_regression: float
    environment_differs: str | None = None  # why the two runs cannot be compared on timings
    inconclusive: str = "pass"
    device_differs: str | None = None  # set: nothing can be judged
    control_moved: str | None = None  # the control shifted within the tolerance: said, not judged

    @property
    def failures(self) -> list[Change]:
        return [c for c in self.changes if c.gating and c.status in FAILED]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.gating and c.status == REGRESSED]

    @property
    def unjudged(self) -> list[Change]:
        """Gating rows the rule could not decide (inconclusive)."""
        return [c for c in self.changes if c.gating and c.status == decision.INCONCLUSIVE]

    @property
    def undersampled(self) -> list[Change]:
        """Gating rows with too few samples on either side for the rule: they cannot be judged."""
        return [c for c in self.changes if c.gating and c.status == decision.UNDERSAMPLED]

    @property
    def disturbed(self) -> list[Change]:
        """Gating rows whose timing block the clock guard marked on either side: they cannot be judged."""
        return [c for c in self.changes if c.gating and c.status == DISTURBED]

    @property
    def unbased(self) -> list[Change]:
        """Gating timings the head measured of a strategy the base passed but failed to time: nothing to judge them against."""
        return [c for c in self.changes if c.gating and c.status == NO_BASE]

    @property
    def unsupported(self) -> list[Change]:
        """Rows of a strategy the base ran that the head's environment made unsupported (explained): no result to judge."""
        return [c for c in self.changes if c.status == "unsupported" and c.base is not None and c.base.value not in (None, "unsupported")]

    @property
    def cannot_judge(self) -> bool:
        return self.device_differs is not None or (
            self.environment_differs is not None and any(c.gating and c.timed for c in self.changes))

    @property
    def decisive(self) -> list[Change]:
        """The failures exit 1 stands on: a failing verdict always; on another device nothing else; in
        another environment no timed regression (timings cannot be judged there)."""
        if self.device_differs:
            return [c for c in self.failures if c.status == FAILING]
        if self.cannot_judge:
            return [c for c in self.failures if not c.timed or c.status != REGRESSED]
        return self.failures

    @property
    def exit_code(self) -> int:
        if self.decisive:
            return 1
        if self.cannot_judge or self.undersampled or self.disturbed or self.unsupported or self.unbased:
            return 2
        if self.unjudged and self.inconclusive == "fail":
            return 1
        return 0


def parse_factor(text: str | float) -> float:
    """'10%' or 0.10 -> 0.10, which must lie in (0, 1). A bare number must be a fraction (1.10 is ambiguous)."""
    where = "--max-regression"
    raw = str(text).strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise HarnessError(where, f"not a factor: {raw!r} (use e.g. 10% or 0.10)") from None
    if percent:
        value /= 100.0
    elif value >= 1.0:
        raise HarnessError(where, f"{raw!r} is ambiguous: write a percentage ({value * 100:g}%) or a fraction below 1")
    if not 0 < value < 1:
        raise HarnessError(where, f"must lie in (0%, 100%), got {raw!r}")
    return value


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a numeric metric value may be."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False


def index_rows(results: ResultsFile, where: str) -> dict[tuple, Row]:
    """Map each row key to its row; a duplicate key, a second control row, or a valued row of a declared metric in
    another unit than the metric table's (its resolution and format are in that unit), is bad input."""
    index, control_at = {}, None
    for i, row in enumerate(results.rows):
        if row.key in index:
            raise HarnessError(f"{where}: rows[{i}]", f"duplicate row {'/'.join(row.key)}")
        if _is_control(row):
            if control_at is not None:
                raise HarnessError(f"{where}: rows[{i}]", f"a second {CONTROL} row (the first is rows[{control_at}]): "
                                                          "a run measures one control, which of two would be compared?")
            control_at = i
        metric = METRICS.get(row.metric)
        if metric is not None and row.value is not None and row.unit != metric.unit:  # a verdict has none
            raise HarnessError(f"{where}: {row.strategy}/{row.metric}.unit", f"{row.unit!r} is not the metric table's "
                                                                              f"{metric.unit!r} (harness/results/metrics.py): "
                                                                              "a mislabelled value is not judged")
        if metric is not None and row.better != metric.better:
            raise HarnessError(f"{where}: {row.strategy}/{row.metric}.better", f"{row.better!r} is not the metric table's "
                                                                                f"{metric.better!r} (harness/results/metrics.py): "
                                                                                "a mislabelled row is not judged")
        index[row.key] = row
    return index


def require_results(results: ResultsFile, where: str) -> None:
    """Bad input unless the file holds a result: an empty file, or one whose rows (the control aside) hold no value
    (a run that measured nothing, each row saying why), is no measurement to compare or report."""
    if not results.rows:
        raise HarnessError(f"{where}: rows", "empty: no results (did the run stop early?)")
    if all(row.value is None or _is_control(row) for row in results.rows):
        raise HarnessError(f"{where}: rows", "no row but the control holds a value: nothing was measured")


def load_results(path: str | Path) -> ResultsFile:
    """Read, upgrade and validate one results file that holds a result (require_results); errors name the file and field."""
    results = read_results(path)
    index_rows(results, str(path))
    require_results(results, str(path))
    return results


def device_type(results: ResultsFile) -> str | None:
    """'cuda' or 'cpu' (lower case): where the file's timings were taken (its environment's device);
    None when the file names no device or another one."""
    env = results.environment
    kind = env.device.split(":")[0].strip().lower() if env is not None and env.device else None
    return kind if kind in DEVICE_TYPES else None


def _gated_timing(row: Row) -> bool:
    metric = METRICS.get(row.metric)
    return metric is not None and metric.timed and bool(metric.gates_on) and row.value is not None


def _known_device(results: ResultsFile, where: str) -> str:
    """The file's device type. An unknown one is bad input when the file holds a timed metric that gates
    somewhere; without one only verdicts and sizes are judged, which gate on every device ('cpu')."""
    kind = device_type(results)
    device = results.environment.device if results.environment is not None else None
    if kind is None and any(_gated_timing(r) for r in results.rows):
        raise HarnessError(f"{where}: environment.device", f"{device!r} is not one of {', '.join(DEVICE_TYPES)}: "
                                                           "its gating timings cannot be judged")
    # The run wrote each row's gating for the device it ran on: where every row whose metric gates on one device type
    # only says the other one (one metric moved in the table since would not), environment.device was relabelled.
    telling = [(i, r) for i, r in enumerate(results.rows) if r.gating is not None and r.metric in METRICS
               and METRICS[r.metric].gates("cpu") != METRICS[r.metric].gates("cuda")]
    if telling and all(r.gating != METRICS[r.metric].gates(kind or "cpu") for _, r in telling):
        i, row = telling[0]
        raise HarnessError(f"{where}: rows[{i}].gating", f"{row.gating}, as every row that tells, was written on another "
                                                         f"device than environment.device {device!r}: a relabelled file is not judged")
    # a run records environment.gpu on CUDA only: beside cpu (its rows' gating edited too, or none), relabelled
    if kind == "cpu" and results.environment.gpu:
        raise HarnessError(f"{where}: environment.gpu", f"{results.environment.gpu!r}, which a run records on CUDA only, beside "
                                                        f"environment.device {device!r}: a relabelled file is not judged")
    return kind or "cpu"


def _disturbed(row: Row) -> str | None:
    guard = (row.detail or {}).get("guard")
    return guard.get("disturbed") if isinstance(guard, dict) else None


def _samples(row: Row) -> list[float]:
    return row.samples or ([row.value] if row.value is not None else [])


def _exact(key: tuple, base: Row, head: Row, f: float, better: str) -> Change:
    b, h = base.value, head.value
    ratio = h / b if b else (None if h == b else math.inf)
    worse, improved = (h > b * (1 + f), h * (1 + f) < b) if better == "lower" else (h * (1 + f) < b, h > b * (1 + f))
    status = REGRESSED if worse else decision.IMPROVED if improved else "unchanged" if h == b else "changed"
    return Change(key, base, head, status, ratio)


def _numeric(key: tuple, base: Row, head: Row, f: float) -> Change:
    metric = METRICS[key[5]]
    if base.value is None:
        return Change(key, base, head, "unchanged" if head.value is None else "added")
    if head.value is None:
        why = (head.detail or {}).get("unsupported")
        return Change(key, base, head, MISSING, note=f"no value in the head{f': {why}' if why else ''}")
    if not metric.timed:
        return _exact(key, base, head, f, metric.better)
    why = _disturbed(base) or _disturbed(head)
    if why:
        return Change(key, base, head, DISTURBED, note=f"clock guard: {why}")
    d = decision.decide(_samples(base), _samples(head), metric.better, f, resolution=metric.resolution)
    return Change(key, base, head, d.status, d.ratio, d, note=d.note)


def env_value(env: Environment | None, name: str):
    """An environment field as the gate compares it: a GPU name apart from case and spacing, TRITON_INTERPRET as
    whether Triton interprets (unset and `0` alike), any other field as recorded."""
    value = getattr(env, name) if env else None
    if name == "gpu":
        return gpu_key(value) if value else None
    return envvars.triton_interpreted(value) if name == "triton_interpret" else value


def _explains(base: ResultsFile, head: ResultsFile) -> str:
    """The environment fields that differ and may make a strategy unsupported ('' when none)."""
    b, h = base.environment, head.environment
    if b is None or h is None:
        return ""
    return ", ".join(f"{k} {getattr(b, k)} -> {getattr(h, k)}" for k in ENV_EXPLAINS if env_value(b, k) != env_value(h, k))


def _verdict(key: tuple, base: Row, head: Row, explained: str) -> Change:
    b, h = base.value, head.value
    if h in BAD_VERDICTS:
        return Change(key, base, head, FAILING, note="" if b == "pass" else f"{b} in the base too")
    if b == h:
        return Change(key, base, head, "unchanged")
    if h == "pass":
        return Change(key, base, head, "fixed" if b in BAD_VERDICTS else "changed")
    # pass, fail or error -> unsupported: the head stopped running what the base ran (a failing check is not hidden so)
    if explained:
        return Change(key, base, head, "unsupported", note=f"the head's environment differs: {explained}")
    why = (head.detail or {}).get("reason") or (head.detail or {}).get("unsupported") or ""
    was = "" if b == "pass" else f" ({b} in the base)"
    return Change(key, base, head, FAILING, note=f"unsupported in the same environment{was}{f': {why}' if why else ''}")


def _change(key: tuple, base: Row | None, head: Row | None, f: float, explained: str) -> Change:
    if base is None:
        if key[5] == "verdict" and head.value in BAD_VERDICTS:
            return Change(key, None, head, FAILING, note="not in the base")
        return Change(key, None, head, "added")
    if head is None:
        if base.value is None:  # a row that held no value (e.g. shadow's cast_us): no result is lost
            return Change(key, base, None, "unchanged", note="no value in the base, not in the head")
        return Change(key, base, None, MISSING, note="not in the head")
    metric = METRICS.get(key[5])
    if metric is None:
        return Change(key, base, head, "undeclared", note="metric not in harness/results/metrics.py: not judged")
    if metric.better is None:
        return _verdict(key, base, head, explained) if key[5] == "verdict" else Change(key, base, head, "unchanged")
    return _numeric(key, base, head, f)


def _same_case(base: ResultsFile, head: ResultsFile, names: tuple[str, str]) -> None:
    for name in CASE_FIELDS:
        b, h = getattr(base.case, name), getattr(head.case, name)
        if b != h:
            why = "only results of the same case compare"
            if name == "workload" and None in (b, h):
                why += " (null in a file older than schema version 5: re-run it to compare it with a newer one)"
            raise HarnessError(f"{names[1]}: case.{name}", f"{h!r} is not the base's {b!r} ({names[0]}): {why}")


def control_decision(base: ResultsFile, head: ResultsFile, f: float) -> decision.Decision | None:
    """The decision rule on the two files' controls (a copy bandwidth: higher is better), None unless both carry one.
    compare_results decides it once for the environment guard and the control-moved note."""
    bc, hc = control(base), control(head)
    return decision.decide(_samples(bc), _samples(hc), "higher", f) if bc is not None and hc is not None else None


def environment_difference(base: ResultsFile, head: ResultsFile, f: float, d: decision.Decision | None) -> str | None:
    """Why base and head were measured in environments too different to compare timings, or None:
    another GPU, a GPU named in one file only, TRITON_INTERPRET on one side only (other kernels ran), a control in
    one file only, controls apart by the decision rule (the head's copy bandwidth lower or higher) or with too few
    samples to tell. d: the controls' decision (control_decision(base, head, f))."""
    bgpu, hgpu = (env_value(r.environment, "gpu") for r in (base, head))
    named = [r.environment.gpu if r.environment else None for r in (base, head)]
    if bgpu and hgpu and bgpu != hgpu:
        return f"GPU {named[0]} vs {named[1]}"
    if bool(bgpu) != bool(hgpu):
        return f"GPU {named[0] or named[1]} named only in the {'base' if bgpu else 'head'}"
    if env_value(base.environment, "triton_interpret") != env_value(head.environment, "triton_interpret"):
        binterp, hinterp = (r.environment.triton_interpret if r.environment else None for r in (base, head))
        return f"TRITON_INTERPRET {binterp or 'unset'} vs {hinterp or 'unset'} (Triton kernels interpreted on one side)"
    bc, hc = control(base), control(head)
    if (bc is None) != (hc is None):
        return f"control {CONTROL} only in the {'base' if bc else 'head'}"
    if bc is None:
        return None
    if d.status == decision.UNDERSAMPLED:
        return f"control {CONTROL} cannot be checked: {d.note}"
    if d.status == decision.INCONCLUSIVE and d.low is None:
        return f"control {CONTROL} cannot be checked: {d.note}"
    if d.low is not None and ((d.low > 1 and d.high > 1 + f) or (d.high < 1 and d.low < 1 / (1 + f))):
        return (f"control {CONTROL} {bc.value:.4g} -> {hc.value:.4g} GB/s "
                f"({d.ratio:.3f}x, 99% CI {d.low:.3f}-{d.high:.3f}: shifted, up to beyond ±{f * 100:g}%)")
    return None


def control_moved(base: ResultsFile, head: ResultsFile, f: float, d: decision.Decision | None) -> str | None:
    """The controls' ratio and interval where it excludes 1 but stays within the tolerance (the machine moved by less
    than the guard judges, which a timing's status may owe to), else None. d: the controls' decision
    (control_decision(base, head, f)), None when a file has no control."""
    bc, hc = control(base), control(head)
    if d is None or d.low is None or d.low <= 1 <= d.high or not 1 / (1 + f) <= d.low <= d.high <= 1 + f:
        return None
    return (f"control {CONTROL} {bc.value:.4g} -> {hc.value:.4g} GB/s ({d.ratio:.3f}x, 99% CI {d.low:.3f}-{d.high:.3f}): "
            f"the machine itself moved, within ±{f * 100:g}%")


MACHINE_FIELDS = ("hostname", "driver", "cuda", "python", "torch", "numpy", "triton", "flashinfer", "flashinfer_path", "sglang",
                  "sglang_commit", "sglang_digest", "power_limit", "clock_sm_max", "sm_count", "reference")


def machine_differences(base: ResultsFile, head: ResultsFile) -> list[str]:
    """'field: base -> head' for each recorded machine field that differs (said, not judged: the GPU and the
    control copy decide whether timings compare)."""
    envs = [r.environment or Environment() for r in (base, head)]
    pairs = ((f, getattr(envs[0], f), getattr(envs[1], f)) for f in MACHINE_FIELDS)
    return [f"{f}: {b} -> {h}" for f, b, h in pairs if b is not None and h is not None and b != h]


def short_commit(commit: str) -> str:
    """A git_commit's first 7 characters, its "-dirty" kept: a clean and a dirty run of one commit stay apart."""
    return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")


def code_difference(base: ResultsFile, head: ResultsFile) -> str | None:
    """The commits where they differ, else the harness_digests where the harness code differed at one (or an unknown)
    commit; None when neither differs. Said, not judged: a gate's base and head are two commits."""
    b, h = (r.environment or Environment() for r in (base, head))
    if b.git_commit and h.git_commit and b.git_commit != h.git_commit:
        return f"commit {short_commit(b.git_commit)} -> {short_commit(h.git_commit)}"
    if b.harness_digest and h.harness_digest and b.harness_digest != h.harness_digest:
        at = f" at one commit {short_commit(b.git_commit)}" if b.git_commit and b.git_commit == h.git_commit else ""
        return f"harness code{at}: harness_digest {b.harness_digest[:7]} -> {h.harness_digest[:7]}"
    return None


def _is_control(row: Row) -> bool:
    """A measured control row: found by its metric, under whatever strategy it is filed (index_rows allows one)."""
    return row.metric == CONTROL and row.value is not None


def control(results: ResultsFile) -> Row | None:
    """The file's control row: the controls of two files pair up whatever strategies they are filed under."""
    return next(filter(_is_control, results.rows), None)


def has_control(results: ResultsFile) -> bool:
    return control(results) is not None


def same_timings(base: ResultsFile, head: ResultsFile) -> bool:
    """Whether every timing both files hold is the same sample for sample, two samples or more in all: one run
    under two labels (an edited `created` or environment), since two runs never draw equal timings."""
    b, h = index_rows(base, "base"), index_rows(head, "head")
    timed = [k for k in b.keys() & h.keys() if (m := METRICS.get(k[5])) is not None and m.timed and _samples(b[k])]
    same = (sorted(_samples(b[k])) == sorted(_samples(h[k])) for k in timed)  # in any order: reordering draws none anew
    return sum(len(_samples(b[k])) for k in timed) > 1 and all(same)


def _timing_crashed(rows: dict[tuple, Row], key: tuple) -> str | None:
    """Why the file's timing of key's strategy failed, where the strategy passed and key is a timed metric: its `timing`
    row (what a run writes instead of every timing when its timing raised); else None (a metric a strategy cannot
    have, such as shadow's cast_us, is a row of its own with no value: no failure)."""
    verdict, timing, metric = rows.get((*key[:5], "verdict")), rows.get((*key[:5], "timing")), METRICS.get(key[5])
    if metric is None or not metric.timed or verdict is None or verdict.value != "pass" or timing is None:
        return None
    return (timing.detail or {}).get("unsupported") or "no timing"


def compare_results(base, head, max_regression: float, inconclusive: str = "pass",
                    names: tuple[str, str] = ("base", "head")) -> Comparison:
    """Compare two results (ResultsFile, or decoded documents) row by row (max_regression: 0.05 = 5%).
    Bad input (another case, a file without a result, a unit other than the metric table's) raises HarnessError."""
    base, head = (r if isinstance(r, ResultsFile) else parse_results(r, n) for r, n in ((base, names[0]), (head, names[1])))
    b, h = index_rows(base, names[0]), index_rows(head, names[1])
    for results, name in zip((base, head), names):
        require_results(results, name)
    _same_case(base, head, names)
    base_device, device = _known_device(base, names[0]), _known_device(head, names[1])
    device_differs = None if base_device == device else f"device {base_device} vs {device}"
    explained = _explains(base, head)
    found = [_change(key, b.get(key), h.get(key), max_regression, explained) for key in sorted(b.keys() | h.keys())]
    unsupported = {c.key[:5] for c in found if c.key[5] == "verdict" and c.status == "unsupported"}  # explained
    # a base strategy with no valued row here is a missing result wherever it is (the control row, filed under any
    # strategy, is the environment guard's, not that strategy's); one whose rows only say why it was not measured
    # (a tpot file's null tpot_ms) is unsupported where the environments differ in a field that explains it
    strategies = {key[:5] for key, row in h.items() if row.value is not None and not _is_control(row)}
    unmeasured = {key[:5] for key, row in h.items() if (row.detail or {}).get("unsupported")} - strategies
    unsupported |= unmeasured if explained else set()
    changes = []
    for change in found:
        if change.status == MISSING and change.key[:5] in unsupported:
            change = replace(change, status="unsupported", note="its strategy is unsupported in the head")
        if change.status == "added" and (why := _timing_crashed(b, change.key)):
            change = replace(change, status=NO_BASE, note=f"the base passed {change.key[3]} but its timing failed: {why}")
        metric = METRICS.get(change.key[5])
        gone = change.status == MISSING and change.key[:5] not in strategies and change.key[5] != CONTROL  # control: the guard's
        gating = metric is not None and (metric.gates(device) or gone) and change.status != "added"
        status = WORSE if change.status == REGRESSED and not gating else change.status
        changes.append(Change(change.key, change.base, change.head, status, change.ratio, change.decision, gating,
                              change.note))
    controls = control_decision(base, head, max_regression)  # decided once: the guard's and the note's
    differs = device_differs or environment_difference(base, head, max_regression, controls)
    return Comparison(changes, max_regression, differs, inconclusive, device_differs,
                      control_moved(base, head, max_regression, controls))


def _fmt(row: Row | None) -> str:
    if row is None:
        return "-"
    metric = METRICS.get(row.metric)
    if metric is None:
        return str(row.value)
    text = metric.format(row.value)
    return f"{text} {row.unit}" if row.unit and row.value is not None and metric.fmt != "bytes" else text


def _fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None or math.isnan(ratio) else "inf" if math.isinf(ratio) else f"{ratio:.3f}x"


def _fmt_interval(c: Change) -> str:
    d = c.decision
    interval = "" if d is None or d.low is None else f"{d.low:.3f}-{d.high:.3f} (MDE {d.mde * 100:.1f}%)"
    return "; ".join(part for part in (interval, c.note) if part)


def comparison_table(comparison: Comparison) -> Table:
    """A rich table of every row whose status is not 'unchanged'."""
    pct = f"{comparison.max_regression * 100:g}%"
    table = Table(title=f"results comparison (tolerance {pct}, {decision.CONFIDENCE:.0%} CI on the ratio of medians)")
    for name in ("preset/scale/scenario", "strategy", "backend", "metric", "base", "head", "ratio", "CI / note",
                 "status", "gate"):
        table.add_column(name, justify="right" if name in ("base", "head", "ratio") else "left")
    for c in comparison.changes:
        if c.status == "unchanged" and not c.note:
            continue
        preset, scale, scenario, strategy, backend, metric = c.key
        style = STATUS_STYLE.get(c.status)
        status = f"[{style}]{c.status}[/]" if style else c.status
        texts = (f"{preset}/{scale}/{scenario}", strategy, backend, metric, _fmt(c.base), _fmt(c.head))  # file text, not markup
        table.add_row(*map(escape, texts), _fmt_ratio(c.ratio), escape(_fmt_interval(c)), status, "gates" if c.gating else "info")
    return table


def _summary(comparison: Comparison) -> str:
    counts: dict[str, int] = {}
    for c in comparison.changes:
        counts[c.status] = counts.get(c.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    gating = sum(c.gating for c in comparison.changes)
    return f"{len(comparison.changes)} rows ({gating} gating): {parts}"


def _why_failed(c: Change, pct: str) -> str:
    if c.status == REGRESSED:
        return f"regressed: {'whole CI' if c.timed else 'value'} beyond {pct}"
    return "missing: absent or null in the head" if c.status == MISSING else "failing: the head's verdict does not pass"


def _unjudged(comparison: Comparison) -> str:
    """What a row the gate could not judge does to the exit code, as its loud line says."""
    return "CANNOT JUDGE (exit 2)" if comparison.exit_code == 2 else "not judged"


def report(comparison: Comparison, console: Console, base: ResultsFile, head: ResultsFile) -> None:
    """The table, the summary and one loud line per outcome that decides the exit code."""
    if any(c.status != "unchanged" or c.note for c in comparison.changes):
        console.print(comparison_table(comparison))
    console.print(_summary(comparison))
    if moved := machine_differences(base, head):
        console.print(f"[yellow]note[/]: the machines differ in {escape('; '.join(moved))} (said, not judged)", highlight=False)
    if code := code_difference(base, head):
        console.print(f"[yellow]note[/]: the runs differ in {escape(code)} (said, not judged)", highlight=False)
    if comparison.control_moved:
        console.print(f"[yellow]note[/]: {escape(comparison.control_moved)} (said, not judged)", highlight=False)
    for side, results in (("base", base), ("head", head)):
        if not has_control(results):
            console.print(f"[yellow]note[/]: {side} carries no {CONTROL} control: environment not checked")
    pct = f"{comparison.max_regression * 100:g}%"
    if comparison.environment_differs:
        verdict = ("no timed metric gates here" if not comparison.cannot_judge else
                   "CANNOT JUDGE (exit 2)" if comparison.exit_code == 2 else "timings not judged")
        console.print(f"[bold yellow]ENVIRONMENTS DIFFER[/]: {escape(comparison.environment_differs)}; {verdict}")
    if (few := comparison.undersampled) and not comparison.device_differs:
        named = ", ".join(f"{c.key[3]}/{c.key[5]} ({len(_samples(c.base))} vs {len(_samples(c.head))})" for c in few)
        console.print(f"[bold yellow]TOO FEW SAMPLES[/]: {escape(named)}; the rule needs {decision.MIN_SAMPLES} samples on "
                      f"each side (re-run with --repeats >= {decision.MIN_SAMPLES}, or tpot --engine sglang with --sglang-output-len "
                      f">= {decision.MIN_SAMPLES + 1}; a file of one number per row cannot be gated); {_unjudged(comparison)}")
    if (shaken := comparison.disturbed) and not comparison.device_differs:
        named = ", ".join(f"{c.key[3]}/{c.key[5]} ({c.note})" for c in shaken)
        console.print(f"[bold yellow]DISTURBED[/]: {escape(named)}; re-run where the GPU's clocks hold; {_unjudged(comparison)}")
    if (unbased := comparison.unbased) and not comparison.device_differs:
        named = ", ".join(f"{c.key[3]}/{c.key[5]}" for c in unbased)
        console.print(f"[bold yellow]NO BASE VALUE[/]: {escape(named)}: the base passed these strategies but failed "
                      f"to time them (re-run the base); {_unjudged(comparison)}")
    if (gone := comparison.unsupported) and not comparison.device_differs:
        named = ", ".join(dict.fromkeys(c.key[3] for c in gone))
        console.print(f"[bold yellow]UNSUPPORTED IN THE HEAD[/]: {escape(named)}, run in the base, gave no result in the "
                      f"head's environment ({escape(_explains(base, head))}); {_unjudged(comparison)}")
    if comparison.unjudged and not comparison.device_differs:
        worst = max((c.decision.mde for c in comparison.unjudged if c.decision and c.decision.mde), default=None)
        mde = f", largest MDE {worst * 100:.1f}%" if worst is not None else ""
        then = "fails the gate (--inconclusive fail)" if comparison.inconclusive == "fail" else "does not fail the gate"
        console.print(f"[bold yellow]INCONCLUSIVE[/]: {len(comparison.unjudged)} gating metric(s) could not be judged "
                      f"against {pct}{mde}; {then}")
    if failed := comparison.decisive:
        named = ", ".join(f"{c.key[3]}/{c.key[5]} {c.status}" for c in failed)
        why = "; ".join(dict.fromkeys(_why_failed(c, pct) for c in failed))
        console.print(f"[bold red]REGRESSION[/]: {len(failed)} gating row(s) failed: {escape(named)} ({why})")


def main_compare(base_path, head_path, max_regression_text, inconclusive: str = "pass") -> int:
    """CLI body: 0 pass, 1 regression, 2 bad input or cannot judge (one line on stderr for bad input)."""
    try:
        factor = parse_factor(max_regression_text)
        if inconclusive not in INCONCLUSIVE_POLICIES:
            raise HarnessError("--inconclusive", f"must be pass or fail, got {inconclusive!r}")
        base, head = load_results(base_path), load_results(head_path)
        comparison = compare_results(base, head, factor, inconclusive, (str(base_path), str(head_path)))
        if base == head or same_timings(base, head):  # the same path twice, a copy, or one run relabelled
            raise HarnessError(str(head_path), f"the same run as the base {base_path}: a gate needs two runs")
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report(comparison, Console(width=None if sys.stdout.isatty() else 200), base, head)
    return comparison.exit_code
