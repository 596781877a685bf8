"""The per-strategy summary printed by `run`: one table, or two (correctness, then timings)
when one would not fit the terminal; metric columns, units and formats come from harness/results/metrics.py.
Host-timed (CPU) figures are labelled as such, and a bandwidth figure is shown only for device timings."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from harness.results.metrics import METRICS

STATUS_STYLE = {"pass": "green", "fail": "bold red", "unsupported": "yellow", "error": "bold red"}
VERDICT_WIDTH = 24  # the verdict column wraps its reason to about this width


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _med(r, metric) -> str:
    s = r.metrics.get(metric.name)
    if s is None:
        return "-"
    return metric.format(s.median) + (f" ±{metric.format(s.iqr)}" if s.iqr is not None else "")


def _verdict(r) -> str:
    status = r.verdict.status.value
    text = f"[{STATUS_STYLE[status]}]{status}[/]"
    if r.verdict.reason:  # a pass's reason says what it left unchecked or which tier it was held to
        text += f"\n[dim]{escape(r.verdict.reason[:160])}[/]"  # the reason as written: an error's [...] is text
    return text


def _stat(r, field: str, spec: str) -> str:
    st = r.verdict.stats
    return _fmt(getattr(st, field) if st else None, spec)


def _columns(host_timed: bool, measured: set[str]) -> tuple[list, list]:
    """(correctness columns, timing columns): (header, cell function) pairs."""
    where = " (host)" if host_timed else ""
    correctness = [
        ("verdict", _verdict),
        ("max_abs", lambda r: _stat(r, "max_abs", ".2e")),
        ("max_rel", lambda r: _stat(r, "max_rel", ".2e")),
        ("norm_rel", lambda r: _stat(r, "norm_rel", ".2e")),
        ("matched", lambda r: _stat(r, "matched_ratio", ".4f")),
    ]
    timing = [  # every measured metric in the metric table's order; bandwidth only where device-timed
        (f"{m.name} ({m.unit}){where if m.timed else ''}", lambda r, m=m: _med(r, m))
        for m in METRICS.values()
        if m.name in measured and not (host_timed and m.unit == "GB/s")
    ]
    timing += [("extra mem", lambda r: METRICS["extra_bytes"].format(r.extra_bytes)),
               ("peak mem", lambda r: METRICS["peak_bytes"].format(r.peak_bytes))]
    return correctness, timing


def _table(title: str, results, columns) -> tuple[Table, int]:
    """A table of the columns that have a value somewhere, and its estimated width."""
    cells = {h: [fn(r) for r in results] for h, fn in columns}
    shown = [h for h, _ in columns if any(c != "-" for c in cells[h])]
    table = Table(title=title)
    table.add_column("strategy", justify="left")
    for h in shown:
        table.add_column(h, justify="left" if h == "verdict" else "right")
    for i, r in enumerate(results):
        table.add_row(r.strategy, *(cells[h][i] for h in shown))
    widths = [max(len(r.strategy) for r in results)] if results else [8]
    widths += [VERDICT_WIDTH if h == "verdict" else max(len(h), *(len(c) for c in cells[h])) for h in shown]
    return table, sum(widths) + 3 * len(widths) + 1


def results_table(title: str, results, host_timed: bool = False, width: int | None = None):
    """One table when it fits `width` (None: always), else a correctness and a timing table."""
    correctness, timing = _columns(host_timed, {name for r in results for name in r.metrics})
    note = " · timings are host wall-clock, not GPU kernel times" if host_timed and any(r.metrics for r in results) else ""
    table, needed = _table(title + note, results, correctness + timing)
    if width is None or needed <= width:
        return table
    return Group(_table(f"{title}: correctness", results, correctness)[0],
                 _table(f"{title}: timings{note}", results, timing)[0])
