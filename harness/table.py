"""The per-strategy summary table printed by `run`; metric columns, units and formats come from harness/metrics.py."""

from __future__ import annotations

from rich.table import Table

from harness.metrics import METRICS

STATUS_STYLE = {"pass": "green", "fail": "bold red", "unsupported": "yellow", "error": "bold red"}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def results_table(title: str, results) -> Table:
    """One row per strategy: verdict, error stats, then median ±IQR of every metric measured (table order)."""
    measured = {name for r in results for name in r.metrics}
    timed = [m for m in METRICS.values() if m.name in measured]
    table = Table(title=title)
    for col in ("strategy", "verdict", "max_abs", "max_rel", "norm_rel", "matched"):
        table.add_column(col, justify="left" if col in ("strategy", "verdict") else "right")
    for m in timed:
        table.add_column(f"{m.name} ({m.unit})" if m.unit else m.name, justify="right")
    table.add_column("extra mem", justify="right")
    table.add_column("peak mem", justify="right")
    for r in results:
        st = r.verdict.stats
        status = r.verdict.status.value
        verdict = f"[{STATUS_STYLE[status]}]{status}[/]"
        if r.verdict.reason and status != "pass":
            verdict += f"\n[dim]{r.verdict.reason[:160]}[/]"
        cells = [f"{m.format(r.metrics[m.name].median)} ±{m.format(r.metrics[m.name].iqr)}" if m.name in r.metrics else "-"
                 for m in timed]
        table.add_row(
            r.strategy,
            verdict,
            _fmt(st.max_abs if st else None, ".2e"),
            _fmt(st.max_rel if st else None, ".2e"),
            _fmt(st.norm_rel if st else None, ".2e"),
            _fmt(st.matched_ratio if st else None, ".4f"),
            *cells,
            METRICS["extra_bytes"].format(r.extra_bytes),
            METRICS["peak_bytes"].format(r.peak_bytes),
        )
    return table
