"""The per-strategy summary table printed by `run`."""

from __future__ import annotations

from rich.table import Table

STATUS_STYLE = {"pass": "green", "fail": "bold red", "unsupported": "yellow", "error": "bold red"}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _gib(n) -> str:
    return "-" if n is None else f"{n / 1024**3:.2f} GiB"


def results_table(title: str, results) -> Table:
    table = Table(title=title)
    for col in ("strategy", "verdict", "max_abs", "max_rel", "norm_rel", "matched", "cast µs/layer", "cast GB/s", "attn µs/layer", "step ms", "eager step ms", "extra mem", "peak mem"):
        table.add_column(col, justify="left" if col in ("strategy", "verdict") else "right")
    for r in results:
        st = r.verdict.stats
        m = r.metrics

        def med(key, spec=".1f"):
            return f"{m[key].median:{spec}} ±{m[key].iqr:{spec}}" if key in m else "-"

        status = r.verdict.status.value
        verdict = f"[{STATUS_STYLE[status]}]{status}[/]"
        if r.verdict.reason and status != "pass":
            verdict += f"\n[dim]{r.verdict.reason[:160]}[/]"
        table.add_row(
            r.strategy,
            verdict,
            _fmt(st.max_abs if st else None, ".2e"),
            _fmt(st.max_rel if st else None, ".2e"),
            _fmt(st.norm_rel if st else None, ".2e"),
            _fmt(st.matched_ratio if st else None, ".4f"),
            med("cast_us"),
            med("cast_gbps", ".0f"),
            med("attn_us"),
            med("step_ms", ".3f"),
            med("step_eager_ms", ".3f"),
            _gib(r.extra_bytes),
            _gib(r.peak_bytes),
        )
    return table
