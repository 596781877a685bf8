"""Compare two results JSON files (base vs head) and gate on regressions.

Each row is judged by its metric's declaration (harness/metrics.py):
- timed metrics (samples of a timing) by the decision rule of harness/decision.py: a 99%
  bootstrap interval on the ratio of medians; `regressed` only when the whole interval lies
  beyond the tolerance, `inconclusive` (with the minimum detectable change) when it
  straddles it, never a silent "noisy";
- exact metrics (bytes) by the tolerance alone; verdicts by pass -> fail/error.
Only gating metrics (gating on the results' device type) can fail the gate; the rest are
reported. Rows on one side only are added/removed; a row whose timing block was disturbed
(clock guard, harness/clocks.py) is reported as `disturbed`, not compared.

Environment guard: when both files carry the control (control_copy_gbps) and the controls
differ beyond the tolerance by the same rule, or the GPU or device type differs, the
environments differ and timed gating metrics cannot be judged.

Exit codes: 1 when a gating metric regressed (a verdict or exact metric always counts);
otherwise 2 "cannot judge" when the environments differ and timed gating metrics are
present; otherwise 1 when a gating metric is inconclusive or disturbed and
inconclusive="fail", else 0 (inconclusive rows are printed loudly with their MDE).
Bad input: 2 with one `error:` line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness import decision
from harness.datafiles import read_json
from harness.errors import HarnessError
from harness.metrics import METRICS
from harness.results import SCHEMA

KEY_FIELDS = ("preset", "scale", "scenario", "strategy", "backend", "metric")
BETTER = ("lower", "higher", None)
BAD_VERDICTS = ("fail", "error")
REGRESSED = decision.REGRESSED
UNJUDGED = (decision.INCONCLUSIVE, "disturbed")
CONTROL = "control_copy_gbps"
INCONCLUSIVE_POLICIES = ("pass", "fail")
STATUS_STYLE = {
    REGRESSED: "bold red",
    decision.INCONCLUSIVE: "bold yellow",
    "disturbed": "bold yellow",
    decision.SLOWER: "yellow",
    decision.IMPROVED: "green",
    "fixed": "green",
    "changed": "yellow",
    "incomparable": "yellow",
    "undeclared": "yellow",
    "added": "cyan",
    "removed": "cyan",
}


@dataclass(frozen=True)
class Change:
    """One row key as seen on both sides; base/head are the row dicts or None."""

    key: tuple
    base: dict | None
    head: dict | None
    status: str  # regressed, inconclusive, slower, improved, unchanged, fixed, changed, disturbed, ...
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

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.gating and c.status == REGRESSED]

    @property
    def unjudged(self) -> list[Change]:
        """Gating rows the rule could not decide (inconclusive) or that must not be compared (disturbed)."""
        return [c for c in self.changes if c.gating and c.status in UNJUDGED]

    @property
    def cannot_judge(self) -> bool:
        return self.environment_differs is not None and any(c.gating and c.timed for c in self.changes)

    @property
    def exit_code(self) -> int:
        if any(not c.timed for c in self.regressions):
            return 1  # a verdict or exact metric regressed: true whatever the environment
        if self.cannot_judge:
            return 2
        if self.regressions or (self.unjudged and self.inconclusive == "fail"):
            return 1
        return 0


def parse_factor(text: str | float) -> float:
    """'10%' or 0.10 -> 0.10. A bare number must be a fraction below 1 (1.10 is ambiguous)."""
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
    if not math.isfinite(value) or value < 0:
        raise HarnessError(where, f"must be a finite non-negative factor, got {raw!r}")
    return value


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a numeric metric value may be."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False


def _check_row(row, where: str) -> tuple:
    if not isinstance(row, dict):
        raise HarnessError(where, f"must be an object, got {type(row).__name__}")
    for name in KEY_FIELDS:
        if not isinstance(row.get(name), str):
            raise HarnessError(f"{where}.{name}", "missing or not a string")
    if "value" not in row:
        raise HarnessError(f"{where}.value", "missing")
    if row.get("better") not in BETTER:
        raise HarnessError(f"{where}.better", f"must be 'lower', 'higher' or null, got {row.get('better')!r}")
    if row.get("better") is not None and row["value"] is not None and not is_number(row["value"]):
        raise HarnessError(f"{where}.value", f"numeric metric needs a finite number or null, got {row['value']!r}")
    if row.get("iqr") is not None and not is_number(row["iqr"]):
        raise HarnessError(f"{where}.iqr", f"must be a finite number or null, got {row['iqr']!r}")
    samples = row.get("samples", [])
    if not isinstance(samples, list) or not all(is_number(v) for v in samples):
        raise HarnessError(f"{where}.samples", "must be a list of finite numbers")
    if row.get("detail") is not None and not isinstance(row["detail"], dict):
        raise HarnessError(f"{where}.detail", f"must be an object or null, got {type(row['detail']).__name__}")
    return tuple(row[name] for name in KEY_FIELDS)


def index_rows(doc, where: str) -> dict[tuple, dict]:
    """Validate a results document and map each row key to its row."""
    if not isinstance(doc, dict):
        raise HarnessError(where, f"top level must be an object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise HarnessError(f"{where}: schema", f"expected {SCHEMA!r}, got {doc.get('schema')!r}")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise HarnessError(f"{where}: rows", "missing or not a list")
    if not isinstance(doc.get("environment", {}), dict):
        raise HarnessError(f"{where}: environment", "must be an object")
    index = {}
    for i, row in enumerate(rows):
        key = _check_row(row, f"{where}: rows[{i}]")
        if key in index:
            raise HarnessError(f"{where}: rows[{i}]", f"duplicate row {'/'.join(key)}")
        index[key] = row
    return index


def load_results(path: str | Path) -> dict:
    """Read and validate one results file; errors name the file and field."""
    from harness.schema import ResultsFile, validate

    path = Path(path)
    doc = read_json(path)
    index_rows(doc, str(path))
    validate(doc, ResultsFile, path)
    return doc


def device_type(doc: dict) -> str:
    """'cuda' or 'cpu': where the file's timings were taken (its environment's device)."""
    env = doc.get("environment") or {}
    device = env.get("device")
    if isinstance(device, str) and device:
        return device.split(":")[0]
    return "cuda" if env.get("gpu") else "cpu"


def _disturbed(row: dict) -> str | None:
    guard = (row.get("detail") or {}).get("guard")
    return guard.get("disturbed") if isinstance(guard, dict) else None


def _samples(row: dict) -> list[float]:
    return row.get("samples") or ([row["value"]] if row["value"] is not None else [])


def _exact(key: tuple, base: dict, head: dict, f: float, better: str) -> Change:
    b, h = base["value"], head["value"]
    ratio = h / b if b else (None if h == b else math.inf)
    worse, improved = (h > b * (1 + f), h * (1 + f) < b) if better == "lower" else (h * (1 + f) < b, h > b * (1 + f))
    status = REGRESSED if worse else decision.IMPROVED if improved else "unchanged" if h == b else "changed"
    return Change(key, base, head, status, ratio)


def _numeric(key: tuple, base: dict, head: dict, f: float) -> Change:
    metric = METRICS[key[5]]
    if base["value"] is None or head["value"] is None:
        return Change(key, base, head, "unchanged" if base["value"] == head["value"] else "changed")
    if not metric.timed:
        return _exact(key, base, head, f, metric.better)
    why = _disturbed(base) or _disturbed(head)
    if why:
        return Change(key, base, head, "disturbed", note=f"clock guard: {why}")
    d = decision.decide(_samples(base), _samples(head), metric.better, f, resolution=metric.resolution)
    return Change(key, base, head, d.status, d.ratio, d, note=d.note)


def _verdict(key: tuple, base: dict, head: dict) -> Change:
    b, h = base["value"], head["value"]
    if b == h:
        status = "unchanged"
    elif b == "pass" and h in BAD_VERDICTS:
        status = REGRESSED
    elif h == "pass" and b in BAD_VERDICTS:
        status = "fixed"
    else:
        status = "changed"
    return Change(key, base, head, status)


def _change(key: tuple, base: dict | None, head: dict | None, f: float) -> Change:
    if base is None:
        return Change(key, None, head, "added")
    if head is None:
        return Change(key, base, None, "removed")
    metric = METRICS.get(key[5])
    if metric is None:
        return Change(key, base, head, "undeclared", note="metric not in harness/metrics.py: not judged")
    if base.get("unit") != head.get("unit") and None not in (base["value"], head["value"]):
        return Change(key, base, head, "incomparable", note=f"unit {base.get('unit')} -> {head.get('unit')}")
    if metric.better is None:
        return _verdict(key, base, head)
    return _numeric(key, base, head, f)


def environment_difference(base: dict, head: dict, b: dict, h: dict, f: float) -> str | None:
    """Why base and head were measured in environments too different to compare timings, or None."""
    benv, henv = base.get("environment") or {}, head.get("environment") or {}
    if device_type(base) != device_type(head):
        return f"device {device_type(base)} vs {device_type(head)}"
    if benv.get("gpu") and henv.get("gpu") and benv["gpu"] != henv["gpu"]:
        return f"GPU {benv['gpu']} vs {henv['gpu']}"
    for key in sorted(b.keys() & h.keys()):
        if key[5] == CONTROL and b[key]["value"] is not None and h[key]["value"] is not None:
            d = decision.decide(_samples(b[key]), _samples(h[key]), "higher", f)
            if d.status in (REGRESSED, decision.IMPROVED):
                return (f"control {CONTROL} {b[key]['value']:.4g} -> {h[key]['value']:.4g} GB/s "
                        f"({d.ratio:.3f}x, 99% CI {d.low:.3f}-{d.high:.3f}, beyond ±{f * 100:g}%)")
    return None


def has_control(doc: dict) -> bool:
    return any(r.get("metric") == CONTROL and r.get("value") is not None for r in doc["rows"])


def compare_results(base: dict, head: dict, max_regression: float, inconclusive: str = "pass") -> Comparison:
    """Compare two results documents row by row (max_regression is a fraction, 0.05 = 5%)."""
    b, h = index_rows(base, "base"), index_rows(head, "head")
    gates_here = device_type(head)
    changes = []
    for key in sorted(b.keys() | h.keys()):
        change = _change(key, b.get(key), h.get(key), max_regression)
        metric = METRICS.get(key[5])
        gating = metric is not None and metric.gates(gates_here) and change.status not in ("added", "removed")
        changes.append(replace(change, gating=gating))
    differs = environment_difference(base, head, b, h, max_regression)
    return Comparison(changes, max_regression, differs, inconclusive)


def _fmt(row: dict | None) -> str:
    if row is None:
        return "-"
    metric = METRICS.get(row["metric"])
    if metric is None:
        return str(row["value"])
    text, unit = metric.format(row["value"]), row.get("unit")
    return f"{text} {unit}" if unit and row["value"] is not None and metric.fmt != "bytes" else text


def _fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None or math.isnan(ratio) else "inf" if math.isinf(ratio) else f"{ratio:.3f}x"


def _fmt_interval(c: Change) -> str:
    d = c.decision
    if d is None or d.low is None:
        return c.note
    return f"{d.low:.3f}-{d.high:.3f} (MDE {d.mde * 100:.1f}%)"


def comparison_table(comparison: Comparison) -> Table:
    """A rich table of every row whose status is not 'unchanged'."""
    pct = f"{comparison.max_regression * 100:g}%"
    table = Table(title=f"results comparison (tolerance {pct}, {decision.CONFIDENCE:.0%} CI on the ratio of medians)")
    for name in ("preset/scale/scenario", "strategy", "backend", "metric", "base", "head", "ratio", "CI / note",
                 "status", "gate"):
        table.add_column(name, justify="right" if name in ("base", "head", "ratio") else "left")
    for c in comparison.changes:
        if c.status == "unchanged":
            continue
        preset, scale, scenario, strategy, backend, metric = c.key
        status = f"[{STATUS_STYLE.get(c.status, '')}]{c.status}[/]"
        table.add_row(f"{preset}/{scale}/{scenario}", strategy, backend, metric, _fmt(c.base), _fmt(c.head),
                      _fmt_ratio(c.ratio), _fmt_interval(c) or c.note, status, "gates" if c.gating else "info")
    return table


def _summary(comparison: Comparison) -> str:
    counts: dict[str, int] = {}
    for c in comparison.changes:
        counts[c.status] = counts.get(c.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    gating = sum(c.gating for c in comparison.changes)
    return f"{len(comparison.changes)} rows ({gating} gating): {parts}" if comparison.changes else "no rows on either side"


def report(comparison: Comparison, console: Console, base: dict, head: dict) -> None:
    """The table, the summary and one loud line per outcome that decides the exit code."""
    if any(c.status != "unchanged" for c in comparison.changes):
        console.print(comparison_table(comparison))
    console.print(_summary(comparison))
    for side, doc in (("base", base), ("head", head)):
        if not has_control(doc):
            console.print(f"[yellow]note[/]: {side} carries no {CONTROL} control: environment not checked")
    pct = f"{comparison.max_regression * 100:g}%"
    if comparison.environment_differs:
        verdict = "CANNOT JUDGE timed gating metrics (exit 2)" if comparison.cannot_judge else "no timed metric gates here"
        console.print(f"[bold yellow]ENVIRONMENTS DIFFER[/]: {comparison.environment_differs}; {verdict}")
    if comparison.unjudged:
        worst = max((c.decision.mde for c in comparison.unjudged if c.decision and c.decision.mde), default=None)
        mde = f", largest MDE {worst * 100:.1f}%" if worst is not None else ""
        then = "fails the gate (--inconclusive fail)" if comparison.inconclusive == "fail" else "does not fail the gate"
        console.print(f"[bold yellow]INCONCLUSIVE[/]: {len(comparison.unjudged)} gating metric(s) could not be judged "
                      f"against {pct}{mde}; {then}")
    if comparison.regressions and not (comparison.cannot_judge and comparison.exit_code == 2):
        console.print(f"[bold red]REGRESSION[/]: {len(comparison.regressions)} gating metric(s) beyond {pct} "
                      "(whole CI) or pass -> fail")


def main_compare(base_path, head_path, max_regression_text, inconclusive: str = "pass") -> int:
    """CLI body: 0 pass, 1 regression, 2 bad input or environments differ (one line on stderr for bad input)."""
    try:
        factor = parse_factor(max_regression_text)
        if inconclusive not in INCONCLUSIVE_POLICIES:
            raise HarnessError("--inconclusive", f"must be pass or fail, got {inconclusive!r}")
        base, head = load_results(base_path), load_results(head_path)
        comparison = compare_results(base, head, factor, inconclusive)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report(comparison, Console(width=None if sys.stdout.isatty() else 200), base, head)
    return comparison.exit_code
