"""The per-strategy summary printed by `run`: one table, or two (correctness, then timings)
when one would not fit the terminal. Host-timed (CPU) figures are labelled as such, and a
bandwidth figure is shown only for device timings."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

STATUS_STYLE = {"pass": "green", "fail": "bold red", "unsupported": "yellow", "error": "bold red"}
VERDICT_WIDTH = 24  # the verdict column wraps its reason to about this width


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _gib(n) -> str:
    return "-" if n is None else f"{n / 1024**3:.2f} GiB"


def _med(r, key: str, spec: str = ".1f") -> str:
    m = r.metrics.get(key)
    return f"{m.median:{spec}} ±{m.iqr:{spec}}" if m is not None else "-"


def _verdict(r) -> str:
    status = r.verdict.status.value
    text = f"[{STATUS_STYLE[status]}]{status}[/]"
    if r.verdict.reason and status != "pass":
        text += f"\n[dim]{r.verdict.reason[:160]}[/]"
    return text


def _stat(r, field: str, spec: str) -> str:
    st = r.verdict.stats
    return _fmt(getattr(st, field) if st else None, spec)


def _columns(host_timed: bool) -> tuple[list, list]:
    """(correctness columns, timing columns): (header, cell function) pairs."""
    where = " (host)" if host_timed else ""
    correctness = [
        ("verdict", _verdict),
        ("max_abs", lambda r: _stat(r, "max_abs", ".2e")),
        ("max_rel", lambda r: _stat(r, "max_rel", ".2e")),
        ("norm_rel", lambda r: _stat(r, "norm_rel", ".2e")),
        ("matched", lambda r: _stat(r, "matched_ratio", ".4f")),
    ]
    timing = [
        (f"cast µs/layer{where}", lambda r: _med(r, "cast_us")),
        *([] if host_timed else [("cast GB/s", lambda r: _med(r, "cast_gbps", ".0f"))]),
        (f"attn µs/layer{where}", lambda r: _med(r, "attn_us")),
        (f"step ms{where}", lambda r: _med(r, "step_ms", ".3f")),
        ("eager step ms", lambda r: _med(r, "step_eager_ms", ".3f")),
        ("extra mem", lambda r: _gib(r.extra_bytes)),
        ("peak mem", lambda r: _gib(r.peak_bytes)),
    ]
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
    correctness, timing = _columns(host_timed)
    note = " · timings are host wall-clock, not GPU kernel times" if host_timed and any(r.metrics for r in results) else ""
    table, needed = _table(title + note, results, correctness + timing)
    if width is None or needed <= width:
        return table
    return Group(_table(f"{title}: correctness", results, correctness)[0],
                 _table(f"{title}: timings{note}", results, timing)[0])
