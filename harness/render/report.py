"""`python -m harness report`: tables (console, Markdown) and plots from results JSON files.

Each case (preset, scale, scenario, backend, and the rest of the file's case record, its device type, GPU and
TRITON_INTERPRET: what `compare` requires equal to judge timings) gets one table of strategies, taken from the
latest run that has it (a `tpot` file's: one column per metric it carries). A case seen in several runs also gets a trend table and plot. A file
named independent.json (written by python -m ci.experiments.independent_timing) adds a cross-check section; one that holds
none of its figures is bad input.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.datafiles import read_json
from harness.errors import HarnessError
from harness.fsio import check_new_dir, check_writable, refuse_filled_dir, refuse_link, write_files
from harness.gate.compare import env_value, index_rows, is_number, load_results, short_commit
from harness.render.table import STATUS_STYLE
from harness.results.metrics import METRICS, readable
from harness.strategies import BASELINE

INDEPENDENT = "independent.json"
# (what, strategy, metric, independent.json key): harness figure at prod scale, b1-l4096
CROSS_CHECKS = (
    ("full-pool cast, torch .to()", "stock", "cast_us", "torch_cast_us"),
    ("full-pool cast, vectorized Triton", "stock_vectorized", "cast_us", "triton_cast_us"),
    ("gather+cast, 4,096 rows", "gather_cast", "cast_us", "gather_cast_4096_us"),
    ("attention, fa3 BF16", "stock", "attn_us", "fa3_bf16_b1_l4096_us"),
)
CROSS_CASE = ("prod", "b1-l4096")
CROSS_TOLERANCE = 0.10

Cell = tuple  # (row dict, Run): one metric of one strategy, and the run it came from


@dataclass(frozen=True)
class Run:
    """One results file."""

    path: Path
    created: datetime
    env: dict
    repro: str
    rows: dict[tuple, dict]
    variant: str = ""  # the rest of the file's case (command, pool, kernel, workload or workload_v4), device type, GPU, TRITON_INTERPRET
    digest: str = ""  # of its rows: two runs stamped in the same second at one commit are still two runs


    @property
    def commit(self) -> str:
        return short_commit(self.env.get("git_commit") or "unknown")

    @property
    def ident(self) -> tuple:
        return self.created, self.env.get("git_commit"), self.digest

    @property
    def source(self) -> str:
        return f"{self.path} ({self.commit}, created {self.created.isoformat()})"


def _load_run(path: Path, gpus: dict[str, str]) -> Run:
    """One results file through the readers' schema (older versions upgraded), rows as plain dicts. Its variant spells
    the GPU as the first run on it did (`gpus`: the name as compare's env_value compares it -> that spelling), so names
    differing only in case or spacing are one GPU, as they are to `compare`."""
    where = str(path)
    results = load_results(path)
    if results.environment is None:
        raise HarnessError(f"{where}: environment", "missing or not an object")
    if results.repro is None:
        raise HarnessError(f"{where}: repro", "missing or not a string")
    try:
        created = datetime.fromisoformat(results.created)
    except (TypeError, ValueError):
        raise HarnessError(f"{where}: created", f"not an ISO timestamp: {results.created!r}") from None
    created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
    rows = {key: asdict(row) for key, row in index_rows(results, where).items()}
    c = results.case
    pool = f"{'?' if c.slots is None else f'{c.slots:,}'} slots x {'?' if c.layers is None else c.layers} layers"
    workload = c.workload[:8] if c.workload else f"{c.workload_v4[:8]} (v4)" if c.workload_v4 else "not recorded"
    env = results.environment  # another GPU or interpreted Triton kernels: compare cannot judge them together, no trend
    variant = (f"{c.command} · {pool} · kernel {c.kernel} · workload {workload} · {(env.device or 'device ?').split(':')[0]}"
               + (f" {gpus.setdefault(env_value(env, 'gpu'), ' '.join(env.gpu.split()))}" if env.gpu else "")
               + (f" · TRITON_INTERPRET={env.triton_interpret}" if env_value(env, "triton_interpret") else ""))
    digest = hashlib.sha256(json.dumps([[list(k), r] for k, r in rows.items()], sort_keys=True, default=str).encode()).hexdigest()
    return Run(path, created, msgspec.to_builtins(results.environment), results.repro, rows, variant, digest)


def _load_independent(path: Path) -> dict:
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise HarnessError(str(path), f"top level must be an object, got {type(doc).__name__}")
    for *_, key in CROSS_CHECKS:
        if key in doc and not (is_number(doc[key]) and doc[key] > 0):  # a timing, in µs
            raise HarnessError(f"{path}: {key}", f"must be a finite number > 0, got {doc[key]!r}")
    if not any(key in doc for *_, key in CROSS_CHECKS):  # a cross-check section of dashes would check nothing
        raise HarnessError(str(path), f"holds none of the cross-check figures ({', '.join(k for *_, k in CROSS_CHECKS)})")
    return doc


# --- cells -----------------------------------------------------------------------------

POOL = "pool"  # the case-level pseudo-strategy that carries the pool's build time

def _value(cell: Cell | None):
    return cell[0]["value"] if cell and is_number(cell[0]["value"]) else None


def _median_iqr(cell: Cell | None, spec: str) -> str:
    value = _value(cell)
    if value is None:
        return "-" if cell is None else "n/a"  # n/a: a row saying why it was not measured
    iqr = cell[0].get("iqr")
    return readable(value, spec) + (f" ±{readable(iqr, spec)}" if iqr is not None else "")


def _ratio(num, den, spec: str, suffix: str = "") -> str:
    return "-" if num is None or not den else readable(num / den, spec) + suffix


def _verdict(cell: Cell | None) -> tuple[str, str]:
    """(verdict text, norm_rel text)."""
    if cell is None:
        return "-", "-"
    row = cell[0]
    detail = row.get("detail") or {}
    norm_rel = (detail.get("stats") or {}).get("norm_rel")
    text = str(row["value"])
    if row["value"] != "pass" and detail.get("reason"):
        text += f": {detail['reason'][:120]}"
    return text, format(norm_rel, ".2e") if is_number(norm_rel) else "-"


def _iqr_pct(cell: Cell | None) -> str:
    value = _value(cell)
    return "-" if not value or not is_number(cell[0].get("iqr")) else f"{cell[0]['iqr'] / value * 100:.1f}%"


def _copy_share(cell: Cell | None) -> str:
    copy_gbps = cell[1].env.get("copy_gbps") if cell else None
    return _ratio(_value(cell), copy_gbps if is_number(copy_gbps) else None, ".0%")


def _speedup(cell: Cell | None, base: Cell | None) -> str:
    """The baseline's time over this one, both of one run."""
    return _ratio(_value(base), _value(cell), ".2f", "×") if cell and base and base[1] is cell[1] else "-"


@dataclass(frozen=True)
class Column:
    """A results-table column: its header, the metric it reads, and its text from a strategy's cell of that metric
    and the baseline's (the registry's BASELINE) cell of it."""

    header: str
    metric: str
    show: Callable[[Cell | None, Cell | None], str]


# the run table of a case (after "strategy"): a metric no column reads is listed under it ("also measured")
COLUMNS = (
    Column("verdict", "verdict", lambda cell, _: _verdict(cell)[0]),
    Column("norm_rel", "verdict", lambda cell, _: _verdict(cell)[1]),
    Column("cast µs", "cast_us", lambda cell, _: _median_iqr(cell, ".1f")),
    Column("cast GB/s", "cast_gbps", lambda cell, _: _median_iqr(cell, ".0f")),
    Column("% copy", "cast_gbps", lambda cell, _: _copy_share(cell)),
    Column("attn µs", "attn_us", lambda cell, _: _median_iqr(cell, ".1f")),
    Column("step ms", "step_ms", lambda cell, _: _median_iqr(cell, ".3f")),
    Column("step device ms", "step_device_ms", lambda cell, _: _median_iqr(cell, ".3f")),
    Column("eager step ms", "step_eager_ms", lambda cell, _: _median_iqr(cell, ".3f")),
    Column(f"speedup vs {BASELINE}", "step_ms", _speedup),
    Column("extra GiB", "extra_bytes", lambda cell, _: _ratio(_value(cell), 1024**3, ".2f")),
    Column("peak GiB", "peak_bytes", lambda cell, _: _ratio(_value(cell), 1024**3, ".2f")),
    Column("GB/step", "bytes_moved", lambda cell, _: _ratio(_value(cell), 1e9, ".3f")),  # roofline (harness/results/roofline.py)
    Column("floor ms", "floor_us", lambda cell, _: _ratio(_value(cell), 1e3, ".3f")),
    Column("× floor", "floor_ratio", lambda cell, _: _ratio(_value(cell), 1, ".2f", "×")),
)
REPEAT_COLUMNS = (Column("cast IQR/median", "cast_us", lambda cell, _: _iqr_pct(cell)),
                  Column("step IQR/median", "step_ms", lambda cell, _: _iqr_pct(cell)))


def _case_rows(strategies: dict[str, dict[str, Cell]], columns: tuple[Column, ...]) -> list[list[str]]:
    base = strategies.get(BASELINE, {})
    return [[name, *(c.show(m.get(c.metric), base.get(c.metric)) for c in columns)] for name, m in strategies.items()]


def _metric_table(strategies: dict[str, dict[str, Cell]]) -> tuple[tuple, list[list[str]]]:
    """A case of other metrics than COLUMNS' (a `tpot` file): one column per metric it carries, in the metric
    table's order, each value as that table formats it."""
    metrics = [m for m in METRICS if any(m in cells for cells in strategies.values())]
    headers = ("strategy", *(f"{m} ({METRICS[m].unit})" if METRICS[m].unit and METRICS[m].fmt != "bytes" else m for m in metrics))

    def shown(cell: Cell | None) -> str:
        if cell is None or not is_number(cell[0]["value"]):
            return _median_iqr(cell, "")
        spec, row = METRICS[cell[0]["metric"]], cell[0]
        return spec.format(row["value"]) + (f" ±{spec.format(row['iqr'])}" if is_number(row.get("iqr")) else "")

    return headers, [[name, *(shown(m.get(metric)) for metric in metrics)] for name, m in strategies.items()]


# --- grouping --------------------------------------------------------------------------

def _case_of(key: tuple) -> tuple:
    preset, scale, scenario, _strategy, backend, _metric = key
    return preset, scale, scenario, backend


def _key(case: tuple, strategy: str, metric: str) -> tuple:
    preset, scale, scenario, backend = case[:4]
    return preset, scale, scenario, strategy, backend, metric


def _cases(runs: list[Run]) -> dict[tuple, dict[str, dict[str, Cell]]]:
    """case (its names, then the run's variant) -> strategy -> metric -> cell, every cell of a strategy from the latest
    run that has that strategy (runs come in `created` order): a metric that run lacks is not filled from an older one."""
    cases: dict = {}
    for run in runs:
        found: dict = {}
        for key, row in run.rows.items():
            found.setdefault((*_case_of(key), run.variant), {}).setdefault(key[3], {})[key[5]] = (row, run)
        for case, strategies in found.items():
            cases.setdefault(case, {}).update(strategies)
    return cases


def _histories(runs: list[Run]) -> dict[tuple, list[Run]]:
    """case -> the distinct runs (by created, commit) that measured it, where there are several."""
    history: dict = {}
    for run in runs:
        for case in dict.fromkeys((*_case_of(key), run.variant) for key in run.rows):
            seen = history.setdefault(case, [])
            if all(r.ident != run.ident for r in seen):
                seen.append(run)
    return {case: h for case, h in history.items() if len(h) > 1}


def _run_labels(runs: list[Run]) -> list[str]:
    commits = [r.commit for r in runs]
    return [c if commits.count(c) == 1 else f"{c} {r.created:%m-%d %H:%M:%S}" for c, r in zip(commits, runs)]


def _unit(key: tuple, history: list[Run]) -> str:
    """The unit a trend row's numbers are in ("-" for a verdict or a pure number)."""
    return next((r.rows[key]["unit"] for r in history if key in r.rows and r.rows[key].get("unit")), "-")


def _trend_value(row: dict | None) -> str:
    if row is None:
        return "-"
    if not is_number(row["value"]):
        return "n/a" if row["value"] is None else str(row["value"])
    return f"{row['value']:.4g}" + (f" ±{row['iqr']:.3g}" if is_number(row.get("iqr")) else "")


def _cross_rows(runs: list[Run], independent: dict) -> list[list[str]]:
    """The latest run's harness figure at CROSS_CASE (runs in `created` order) vs the independent one; the harness row
    names the preset, GPU and file it came from."""
    rows = []
    for what, strategy, metric, ikey in CROSS_CHECKS:
        found = next(((key, row, run) for run in reversed(runs) for key, row in run.rows.items()
                      if key[1:3] == CROSS_CASE and (key[3], key[5]) == (strategy, metric) and is_number(row["value"])), None)
        ours = found[1]["value"] if found else None
        source = f" · {found[0][0]} · {found[2].env.get('gpu') or found[2].env.get('device')} · {found[2].path}" if found else ""
        theirs = independent.get(ikey)
        cells = [what, f"{strategy} {metric}{source}", ikey, _ratio(ours, 1, ".2f"), _ratio(theirs, 1, ".2f")]
        if ours is None or not theirs:
            rows.append(cells + ["-", "-"])
            continue
        diff = ours / theirs - 1
        rows.append(cells + [f"{diff:+.1%}", "✓" if abs(diff) <= CROSS_TOLERANCE else "✗"])
    return rows


# --- rendering -------------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    group: str
    title: str
    headers: tuple
    rows: list[list[str]]
    notes: tuple[str, ...] = ()
    repro: tuple[str, ...] = ()


def _title(case: tuple, runs: list[Run]) -> str:
    """A case's names; with its variant where the runs hold another case of the same names."""
    shown = case if len({r.variant for r in runs if any(_case_of(k) == case[:4] for k in r.rows)}) > 1 else case[:4]
    return " · ".join(shown)


def _sections(runs: list[Run], independent: dict | None, repeatability: bool) -> list[Section]:
    columns = COLUMNS + (REPEAT_COLUMNS if repeatability else ())
    tabled = {c.metric for c in columns}
    sections = []
    for case, strategies in _cases(runs).items():
        used = {id(cell[1]) for m in strategies.values() for cell in m.values()}
        case_runs = [r for r in runs if id(r) in used]
        copy = [f"{r.env['copy_gbps']:.0f}" for r in case_runs if is_number(r.env.get("copy_gbps"))]
        notes = (f"device copy bandwidth (100% in % copy): {', '.join(copy)} GB/s",) if copy else ()
        pool = strategies.pop(POOL, {})
        if (build := _value(pool.get("build_s"))) is not None:
            notes += (f"FP8 pool built in {build:.2f} s",)
        if len(case_runs) > 1:  # each strategy's row is the latest run's that has it: say which run each came from
            notes += tuple(f"{name}: from {next(iter(m.values()))[1].source}" for name, m in strategies.items() if m)
        if any("verdict" in m for m in strategies.values()):
            table = ("strategy", *(c.header for c in columns)), _case_rows(strategies, columns)
            notes += tuple(f"also measured: {name} {metric} {_trend_value(cell[0])} {cell[0].get('unit') or ''}".rstrip()
                           for name, m in strategies.items() for metric, cell in m.items() if metric not in tabled)
        else:
            table = _metric_table(strategies)  # no verdict: not a `run` file (a `tpot` file)
        sections.append(Section("Results", _title(case, runs), *table, notes, tuple(dict.fromkeys(r.repro for r in case_runs))))
    for case, history in _histories(runs).items():
        keys = dict.fromkeys(k for r in history for k in r.rows if _case_of(k) == case[:4])
        rows = [[k[3], k[5], _unit(k, history), *(_trend_value(r.rows.get(k)) for r in history)] for k in keys]
        labels = _run_labels(history)
        notes = tuple(f"{label}: {r.path} (created {r.created.isoformat()})" for label, r in zip(labels, history))
        sections.append(Section("Trends", _title(case, runs), ("strategy", "metric", "unit", *labels), rows, notes))
    if independent is not None:
        note = (f"independent figures: {independent.get('tool', '?')}; harness figures: {' '.join(CROSS_CASE)};"
                f" ✓ within {CROSS_TOLERANCE:.0%}")
        sections.append(Section("Cross-check", "harness vs independent timing (µs)",
                                ("check", "harness row", "independent key", "harness", "independent", "difference", "agrees"),
                                _cross_rows(runs, independent), (note,)))
    return sections


def _env_line(env: dict) -> str:
    parts = [env.get("gpu") or f"CPU {env.get('cpu') or ''}".strip()]
    parts += [f"{label} {env[k]}" for k, label in (("capability", "sm"), ("driver", "driver"), ("torch", "torch"),
                                                      ("flashinfer", "flashinfer"), ("clock_sm", "SM clock")) if env.get(k)]
    parts.append(f"commit {short_commit(env.get('git_commit') or 'unknown')}")
    return " · ".join(parts)


def _left(header: str) -> bool:
    return header in ("strategy", "verdict", "metric", "unit", "check", "harness row", "independent key")


def _rich_table(section: Section) -> Table:
    table = Table(title=f"{section.group}: {section.title}")
    for h in section.headers:
        table.add_column(h, justify="left" if _left(h) else "right")
    for cells in section.rows:
        table.add_row(*(Text(c, style=STATUS_STYLE.get(c.split(":")[0], "") if h == "verdict" else "")
                        for h, c in zip(section.headers, cells)))
    return table


def _markdown(runs: list[Run], sections: list[Section], plots: list[str]) -> str:
    def row(cells) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    lines = ["# mla-harness report", "", f"{len(runs)} results file(s), created {runs[0].created.isoformat()}"
             f" to {runs[-1].created.isoformat()}.", "", "## Environment", ""]
    lines += [f"- {line}" for line in dict.fromkeys(_env_line(r.env) for r in runs)]
    group = None
    for s in sections:
        if s.group != group:
            group = s.group
            lines += ["", f"## {group}"]
        lines += ["", f"### {s.title}", "", row(s.headers), row("---" if _left(h) else "---:" for h in s.headers)]
        lines += [row(cells) for cells in s.rows]
        lines += [""] * bool(s.notes or s.repro) + [f"- {n}" for n in s.notes] + [f"- repro: `{r}`" for r in s.repro]
    if plots:
        lines += ["", "## Plots", "", *(f"![{Path(p).stem}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"


PLOT_RANGE = (1e-30, 1e30)  # a log axis over values past these overflows matplotlib's limits: those are in the tables only


def _plots(runs: list[Run]) -> tuple[dict[str, bytes], list[str]]:
    """PNG bytes by file name: grouped bars per case, and step_ms trends; and the values left out of them (outside
    PLOT_RANGE, or with an IQR past it), each as "strategy/metric value". ImportError without matplotlib."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):  # names from the files are text, never mathtext ($...$)
        return _figures(runs)


def _figures(runs: list[Run]) -> tuple[dict[str, bytes], list[str]]:
    """What `_plots` returns."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    def png(fig) -> bytes:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120)
        return buf.getvalue()

    left_out = []

    def positive(row: dict | None, what: str = "") -> bool:
        if row is None or not is_number(row["value"]) or row["value"] <= 0:  # log scale
            return False
        if PLOT_RANGE[0] < row["value"] < PLOT_RANGE[1] and (row.get("iqr") or 0) < PLOT_RANGE[1]:
            return True
        left_out.append(f"{what} {row['value']:g}")
        return False

    def half_iqr(row: dict) -> float:
        return (row.get("iqr") or 0) / 2

    def finish(ax, ylabel: str) -> None:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))

    cases = _cases(runs)
    varying = [i for i in range(5) if len({c[i] for c in cases}) > 1] or [2]
    labels = ["\n".join(c[i] for i in varying) for c in cases]
    plots = {}
    for metric, unit, what in (("step_ms", "ms", "decode step, all layers"), ("cast_us", "µs", "cast, per layer")):
        groups = [{s: m[metric][0] for s, m in c.items() if metric in m} for c in cases.values()]
        strategies = list(dict.fromkeys(s for g in groups for s, row in g.items() if positive(row, f"{s}/{metric}")))
        if not strategies:
            continue
        fig = Figure(figsize=(max(7.0, 2.5 + len(cases) * (0.3 * len(strategies) + 0.6)), 4.5))
        ax = fig.add_subplot()
        width = 0.8 / len(strategies)
        for i, s in enumerate(strategies):
            bars = [(x, g[s]) for x, g in enumerate(groups) if positive(g.get(s), f"{s}/{metric}")]
            ax.bar([x - 0.4 + width * (i + 0.5) for x, _ in bars], [r["value"] for _, r in bars], width,
                   yerr=[half_iqr(r) for _, r in bars], capsize=2, label=s)
        ax.set_title(f"{metric}: {what}", fontsize="medium")
        ax.set_xticks(range(len(cases)), labels)
        finish(ax, f"{metric} ({unit}, median; whiskers ±IQR/2)")
        plots[f"{metric}.png"] = png(fig)
    if histories := _histories(runs):
        fig = Figure(figsize=(8.5, 0.5 + 3.2 * len(histories)))
        for ax, (case, history) in zip(fig.subplots(len(histories), 1, squeeze=False)[:, 0], histories.items()):
            for s in dict.fromkeys(k[3] for r in history for k in r.rows if _case_of(k) == case[:4] and k[5] == "step_ms"):
                key = _key(case, s, "step_ms")
                points = [(x, r.rows[key]) for x, r in enumerate(history) if positive(r.rows.get(key), f"{s}/step_ms")]
                ax.errorbar([x for x, _ in points], [r["value"] for _, r in points],
                            yerr=[half_iqr(r) for _, r in points], marker="o", capsize=2, label=s)
            ax.set_xticks(range(len(history)), _run_labels(history))
            ax.margins(x=0.1)
            ax.set_title(_title(case, runs), fontsize="medium")
            finish(ax, "step_ms (ms, median; whiskers ±IQR/2)")
        plots["trend_step_ms.png"] = png(fig)
    return plots, list(dict.fromkeys(left_out))


WROTE = ".report-files.json"  # in --out: the sha256 of each file the report wrote there
REPORT_FILES = ("report.md", "step_ms.png", "cast_us.png", "trend_step_ms.png", WROTE)  # every file --out may write


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Before rendering: --out is a folder, new or empty unless `force`; never a file. Each file the report may
    write is checked as every output is (fsio.check_writable): one made there while the report renders is kept."""
    refuse_filled_dir(out_dir, "--out", force, "report.md and plots")
    check_new_dir(out_dir, "--out")
    for name in REPORT_FILES:
        refuse_link(out_dir / name, "--out")
        check_writable(out_dir / name, "--out", force)


def _earlier_files(out_dir: Path) -> list[str]:
    """The files an earlier report wrote to `out_dir` that are still as it wrote them: those its WROTE names, with
    the sha256 it recorded (a file it does not name, or one changed since, is the user's, and is kept)."""
    try:
        wrote = json.loads((out_dir / WROTE).read_bytes())
    except (OSError, ValueError, RecursionError):  # none, unreadable or not JSON: no file there is known to be a report's
        return []
    if not isinstance(wrote, dict):
        return []
    return [name for name in REPORT_FILES if isinstance(wrote.get(name), str) and (path := out_dir / name).is_file()
            and not path.is_symlink() and hashlib.sha256(path.read_bytes()).hexdigest() == wrote[name]]


def render_report(paths: list[Path], out_dir: Path | None, console: Console) -> None:
    """Print the report; with out_dir also write report.md and plots there (only once every input loads)."""
    paths = [Path(p) for p in paths]
    independent_paths = [p for p in paths if p.name == INDEPENDENT]
    if len(independent_paths) > 1:
        raise HarnessError(INDEPENDENT, f"given {len(independent_paths)} times; pass one")
    gpus: dict[str, str] = {}
    runs = sorted((_load_run(p, gpus) for p in paths if p.name != INDEPENDENT), key=lambda r: r.created)
    independent = _load_independent(independent_paths[0]) if independent_paths else None  # a missing one named first
    if not runs:
        raise HarnessError("report", f"no results files given ({INDEPENDENT} is a cross-check beside them, not one)")

    for line in dict.fromkeys(_env_line(r.env) for r in runs):
        console.print(f"environment: {line}", markup=False, highlight=False)
    for s in _sections(runs, independent, repeatability=False):
        console.print(_rich_table(s))
        for line in (*s.notes, *(f"repro: {r}" for r in s.repro)):
            console.print(line, markup=False, highlight=False)
    if out_dir is None:
        return

    try:
        plots, left_out = _plots(runs)
    except ImportError as exc:
        plots, left_out = {}, []
        console.print(f"plots skipped: matplotlib is not importable ({exc}); install mla-harness[report]", markup=False)
    if left_out:
        console.print(f"not plotted (outside {PLOT_RANGE[0]:g}..{PLOT_RANGE[1]:g}, in the tables): {', '.join(left_out)}",
                      markup=False, highlight=False)
    files = {"report.md": _markdown(runs, _sections(runs, independent, repeatability=True), list(plots)).encode(), **plots}
    files[WROTE] = (json.dumps({name: hashlib.sha256(data).hexdigest() for name, data in files.items()}, indent=2) + "\n").encode()
    for name in REPORT_FILES:  # again: one made while the report rendered
        refuse_link(out_dir / name, "--out")
    stale = [out_dir / name for name in _earlier_files(out_dir) if name not in files]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_files({out_dir / name: data for name, data in files.items()}, "--out")
        for path in stale:  # an earlier report's plot, unchanged, that this one does not make: it would sit there unlinked
            path.unlink()
    except OSError as exc:
        raise HarnessError(str(out_dir), f"cannot write: {exc.strerror or exc}") from None
    console.print(f"wrote {out_dir / 'report.md'}" + "".join(f", {name}" for name in plots)
                  + "".join(f"; removed the earlier report's {path.name}" for path in stale), markup=False, highlight=False)
