"""TPOT report: `python -m harness.tpot.report RESULTS.json... [--tp2 tp2_check.json] --out DIR`.

A Markdown table per case (TPOT, attention path, attention share, roofline) with the articles'
figures beside it, the rotation-vs-distinct check, the TP2 all-reduce check, and a stacked bar per
strategy (attention path vs the rest of the step) as tpot.png.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Annotated, NamedTuple

import msgspec

from harness.datafiles import read_json
from harness.errors import HarnessError, interruptible
from harness.fsio import check_writable, refuse_filled_dir, refuse_link, write_files
from harness.gate.compare import device_type, load_results
from harness.inputs.cases import refuse_clobbering
from harness.results.metrics import readable
from harness.results.schema import BOUND, Count, Finite, NonNegative, validate

# GLM-5-NVFP4 (FP4 weights, not FP8) on 8x RTX PRO 6000 (SM120, PCIe), SGLang, single stream
# (/work/shared/seeds): the whole-pool FP8->BF16 cast was 64.6 ms of a 95.6 ms TPOT (69%);
# with a BF16 shadow buffer TPOT went to 74.1 ms.
ARTICLE = {"tpot_ms": 95.6, "cast_ms": 64.6, "cast_share": 0.69, "tpot_after_fix_ms": 74.1}


Positive = Annotated[float, msgspec.Meta(gt=0, le=BOUND)]  # finite (NaN fails gt)
Size = Annotated[int, msgspec.Meta(ge=1)]


class _Point(msgspec.Struct):
    bytes: Count
    us: Positive


class _StepCheck(msgspec.Struct):
    scenario: str
    layers: Size
    nccl_ms: Positive | None = None
    modeled_ms: Positive | None = None
    none_ms: Positive | None = None
    modeled_over_nccl: Positive | None = None


class TP2Check(msgspec.Struct):
    """The fields of python -m ci.experiments.tp2_allreduce's tp2_check.json this report reads."""

    world: Annotated[int, msgspec.Meta(ge=2)]
    gpu: str
    nvls: str | int | None = None
    allreduce_points: list[_Point] = []
    step_checks: list[_StepCheck] = []


class _Kernel(msgspec.Struct):
    name: str
    ms: NonNegative
    count: Count


class _Profile(msgspec.Struct):
    """torch.profiler's kernels of one eager step, or the error that stopped it (harness.tpot.tpot.time_strategy)."""

    kernel_ms: NonNegative | None = None
    launches: Count | None = None
    top: list[_Kernel] | None = None
    error: str | None = None

    def __post_init__(self):
        missing = [name for name in ("kernel_ms", "launches", "top") if getattr(self, name) is None]
        if self.error is None and missing:
            raise ValueError(f"{missing[0]}: missing (a profile without an error has kernel_ms, launches and top)")


class _Part(msgspec.Struct):
    ms: NonNegative
    floor_bytes: NonNegative
    floor_ms: NonNegative | None = None
    over_floor: NonNegative | None = None


class _Breakdown(msgspec.Struct):
    parts: dict[str, _Part]
    sum_ms: NonNegative
    tpot_ms: Positive
    unattributed_ms: Finite
    how: str
    parts_add_up: bool = True  # False: CPU host times of separate runs (absent from files before it was recorded: CUDA's)


class TpotDetail(msgspec.Struct):
    """The fields of a tpot_ms row's detail this report reads (harness.tpot.tpot.to_rows writes them; an --engine
    sglang row has none of the model's but its engine and command; a strategy that did not run, unsupported)."""

    layers: Size | None = None
    weight_sets: Size | None = None
    reuse_distance_over_l2: Finite | None = None
    mean_active_experts: NonNegative | None = None
    pool_bytes: NonNegative = 0
    allreduce: str | None = None
    kernels: dict[str, str] = {}
    fits_with_full_weights: bool | None = None
    max_slots_with_full_weights: Count | None = None
    memory_plan: str | None = None
    eager_kernels: _Profile | None = None
    breakdown: _Breakdown | None = None
    engine: str | None = None
    command: list[str] = []
    unsupported: str | None = None

    def __post_init__(self):
        if self.layers is None and self.engine is None and self.unsupported is None:
            raise ValueError("layers: missing (a detail holds the harness step's layers, an --engine sglang run's engine, "
                             "or why the strategy did not run: unsupported)")


class RotationDetail(msgspec.Struct):
    """The fields of a rotation_check row's detail this report reads (harness.tpot.tpot.rotation_check)."""

    strategy: str
    layers: Size
    weight_sets: Size
    rotated_ms: Positive
    distinct_ms: Positive
    ratio: Positive


DETAILS = {"tpot_ms": TpotDetail, "rotation_check": RotationDetail}


class _Metric(NamedTuple):
    value: float | str | None
    detail: TpotDetail | RotationDetail | None  # checked: a metric in DETAILS (else None)


def _cases(paths: list[Path]) -> dict[tuple, dict[str, dict[str, _Metric]]]:
    """{(preset, scale, scenario, file path, device type): {strategy: {metric: _Metric}}} of `harness tpot` results files,
    one case per file (two files are never merged, whatever their names), read as compare reads them (load_results:
    a row in another unit than the metric table's is refused; the row details this report reads checked too):
    anything else is one error naming the field."""
    cases: dict = {}
    for path in paths:
        results = load_results(path)
        if results.case.command != "tpot":
            raise HarnessError(f"{path}: case.command", f"{results.case.command!r}: not a `harness tpot` results file "
                                                        "(python -m harness report renders it)")
        for i, row in enumerate(results.rows):
            kind = DETAILS.get(row.metric)
            detail = None if kind is None else validate(row.detail, kind, f"{path}: rows[{i}].detail")
            key = (row.preset, row.scale, row.scenario, str(path), device_type(results))
            cases.setdefault(key, {}).setdefault(row.strategy, {})[row.metric] = _Metric(row.value, detail)
    return cases


def _fmt(v, spec: str) -> str:
    return "-" if v is None else readable(v, spec)


def _val(metrics: dict[str, _Metric], name: str):
    return metrics[name].value if name in metrics else None


def render(paths: list[Path], tp2: Path | None) -> tuple[str, list[tuple[str, dict]]]:
    """(markdown, [(case title, {strategy: (attn_ms, rest_ms)})]) of the TPOT results; attn_ms None: the step unsplit."""
    lines = ["# End-to-end TPOT (model-shaped decode step, one TP rank)", ""]
    bars = []
    for key, strategies in _cases(paths).items():
        # the strategies with a step (the control row, or another metric alone, has none)
        steps = {name: m["tpot_ms"].detail for name, m in strategies.items() if "tpot_ms" in m}
        if not steps:
            continue
        preset, scale, scenario, fname, device = key
        # the attention share only where the doc calls it one (CUDA graphs): on CPU attn_path_ms and tpot_ms are host
        # times of separate runs, as the breakdown's parts are, and their ratio can pass 100%
        split = device == "cuda"
        # the header's step: the first strategy that ran (one that did not carries only why: no layers, sets or kernels)
        d = next((step for step in steps.values() if step.unsupported is None), None)
        title = f"{preset} · {scale} · {scenario} ({fname})"
        copy = next((_val(m, "control_copy_gbps") for m in strategies.values() if "control_copy_gbps" in m), None)
        if d is None:
            what = "Layer count unknown: no strategy ran (each one's reason is in the table)."
        elif d.engine is not None:  # --engine sglang: SGLang's own benchmark, none of the harness's model
            what = f"SGLang's own {d.engine} (--engine sglang), each timed decode step a sample: `{' '.join(d.command)}`."
        else:
            reuse = d.reuse_distance_over_l2
            reuse_text = "no set is reused" if reuse is None or reuse < 0 else f"reuse distance {reuse:.1f}x L2"
            what = (f"{d.layers} layers, {d.weight_sets} rotated weight sets ({reuse_text}), mean active experts "
                    f"{_fmt(d.mean_active_experts, '.1f')}; pool {_fmt(d.pool_bytes / 1e9, '.1f')} GB; all-reduce: {d.allreduce}.")
        if copy is not None:  # the control row: the copy compare's environment check reads, not a strategy
            what += f" Control copy {_fmt(copy, '.1f')} GB/s ({'device' if device == 'cuda' else 'host'} memory)."
        lines += [f"## {title}", "", what, "",
                  "| strategy | TPOT ms | attention path ms | attention share | roofline ms | TPOT / roofline | GB moved (weights + KV + cast) | fits beside full rank weights |",
                  "|---|---|---|---|---|---|---|---|"]
        case_bars = {}
        for name, step in steps.items():
            m = strategies[name]
            tpot = _val(m, "tpot_ms")
            if tpot is None:
                lines.append(f"| {name} | {step.unsupported or 'not measured'} | | | | | | |")
                continue
            attn = _val(m, "attn_path_ms")
            gb = [_val(m, k) for k in ("step_weight_bytes", "step_kv_bytes", "step_cast_bytes")]
            total = None if None in gb else sum(gb) / 1e9  # a null or missing row is no 0 B: no total
            moved = f"{_fmt(total, '.2f')} ({' + '.join(_fmt(None if b is None else b / 1e9, '.2f') for b in gb)})"
            fits = step.fits_with_full_weights
            lines.append(f"| {name} | {_fmt(tpot, '.2f')} | {_fmt(attn, '.2f')} | {_fmt(_val(m, 'attn_share') if split else None, '.0%')} | "
                         f"{_fmt(_val(m, 'roofline_ms'), '.2f')} | {_fmt(_val(m, 'tpot_over_roofline'), '.2f')} | "
                         f"{moved} | {'-' if fits is None else ('yes' if fits else 'no, max ' + _fmt(step.max_slots_with_full_weights, ',') + ' slots')} |")
            # split into attention path and rest only where the share is shown and within the step: else one bar
            whole = not split or attn is None or attn > tpot
            case_bars[name] = (None, tpot) if whole else (attn, tpot - attn)
        lines.append(f"| article (GLM-5-NVFP4, 8x RTX PRO 6000, stock) | {ARTICLE['tpot_ms']} | cast alone {ARTICLE['cast_ms']} | cast {ARTICLE['cast_share']:.0%} | | | | |")
        lines.append(f"| article, BF16 shadow buffer | {ARTICLE['tpot_after_fix_ms']} | | | | | | |")
        lines += ["", "Kernels: " + ("; ".join(f"{k} = {v}" for k, v in d.kernels.items()) if d else "-"), ""]
        for name, step in steps.items():
            prof = step.eager_kernels
            if prof is None:
                continue
            head = f"Where the time goes ({name}, one eager step, torch.profiler):"
            if prof.error is not None:  # what tpot records when the profiler failed
                lines += [f"{head} not profiled: {prof.error}.", ""]
                continue
            top = ", ".join(f"{k.name[:40]} {k.ms:.2f} ms x{k.count}" for k in prof.top[:6])
            lines += [f"{head} {prof.kernel_ms:.2f} ms in {prof.launches} kernel launches; top: {top}.", ""]
        for name, step in steps.items():
            bd = step.breakdown
            if bd is None:
                continue
            lines += [f"Where the time goes ({name}, TPOT {bd.tpot_ms:.2f} ms; {bd.how}):", "",
                      "| component | ms | share of TPOT | floor GB | floor ms | ms / floor |", "|---|---|---|---|---|---|"]
            for part, v in bd.parts.items():
                lines.append(f"| {part} | {_fmt(v.ms, '.2f')} | {_fmt(v.ms / bd.tpot_ms if bd.parts_add_up else None, '.0%')} | "
                             f"{_fmt(v.floor_bytes / 1e9, '.2f')} | {_fmt(v.floor_ms, '.2f')} | {_fmt(v.over_floor, '.1f')} |")
            if bd.parts_add_up:
                lines.append(f"| sum (unattributed {bd.unattributed_ms:+.2f} ms) | {bd.sum_ms:.2f} | {bd.sum_ms / bd.tpot_ms:.0%} | | | |")
            lines.append("")
        plans = [step.memory_plan for step in steps.values() if step.memory_plan]
        if plans:
            lines += ["Memory plan (beside the rank's full weights):", ""] + [f"- {p}" for p in plans] + [""]
        for m in strategies.values():
            if "rotation_check" in m:
                rc = m["rotation_check"].detail
                lines += [f"Rotation check ({rc.strategy}, {rc.layers} layers): {rc.weight_sets} rotated sets "
                          f"{rc.rotated_ms:.3f} ms vs every layer distinct {rc.distinct_ms:.3f} ms (ratio {rc.ratio:.3f}).", ""]
        bars.append((title, case_bars))
    if tp2 is not None:
        doc = validate(read_json(tp2), TP2Check, tp2)
        lines += ["## TP2 all-reduce check (real NCCL on two GPUs)", "",
                  f"{doc.world}x {doc.gpu}, NCCL_NVLS_ENABLE={doc.nvls}.", "",
                  "| message bytes | all-reduce µs |", "|---|---|"]
        lines += [f"| {p.bytes:,} | {p.us:.2f} |" for p in doc.allreduce_points]
        lines += ["", "| scenario | layers | real NCCL ms | modeled (latency table) ms | no all-reduce ms | modeled / real |", "|---|---|---|---|---|---|"]
        for c in doc.step_checks:
            lines.append(f"| {c.scenario} | {c.layers} | {_fmt(c.nccl_ms, '.3f')} | {_fmt(c.modeled_ms, '.3f')} | "
                         f"{_fmt(c.none_ms, '.3f')} | {_fmt(c.modeled_over_nccl, '.3f')} |")
        lines.append("")
    return "\n".join(lines) + "\n", bars


def plot(bars) -> bytes | None:
    """PNG of stacked bars (attention path, rest of the step) per strategy and case; None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    with matplotlib.rc_context({"text.parse_math": False}):  # names from the files are text, never mathtext ($...$)
        return _figure(bars)


def _figure(bars) -> bytes:
    """The PNG `plot` makes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 + 3 * len(bars), 4))
    FigureCanvasAgg(fig)
    for i, (title, case_bars) in enumerate(bars):
        ax = fig.add_subplot(1, len(bars) + 1, i + 1)
        names = [n for n in case_bars if case_bars[n][0] is not None]
        whole = [n for n in case_bars if case_bars[n][0] is None]
        ax.bar(names, [case_bars[n][0] for n in names], label="attention path")
        ax.bar(names, [case_bars[n][1] for n in names], bottom=[case_bars[n][0] for n in names], label="rest of the step")
        if whole:  # no split there (CPU host times, or no attention path): the bar is the whole step
            ax.bar(whole, [case_bars[n][1] for n in whole], color="grey", label="whole step (not split)")
            ax.legend(fontsize=7)
        ax.set_title(title.replace(" (", "\n("), fontsize=8)
        ax.set_ylabel("ms")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax = fig.add_subplot(1, len(bars) + 1, len(bars) + 1)
    ax.bar(["article stock", "article shadow"], [ARTICLE["cast_ms"], 0], label="attention path (cast)")
    ax.bar(["article stock", "article shadow"], [ARTICLE["tpot_ms"] - ARTICLE["cast_ms"], ARTICLE["tpot_after_fix_ms"]],
           bottom=[ARTICLE["cast_ms"], 0], label="rest of the step")
    ax.set_title("article: GLM-5-NVFP4, 8x RTX PRO 6000", fontsize=8)
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


@interruptible
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.tpot.report", description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--tp2", type=Path, help="tp2_check.json from python -m ci.experiments.tp2_allreduce")
    ap.add_argument("--out", type=Path, required=True, help="folder for tpot.md and tpot.png (new or empty, unless --force)")
    ap.add_argument("--force", action="store_true", help="--out: write into a folder that already holds files (else exit 2), replacing "
                                                         "tpot.md / tpot.png there (a link there: exit 2; without matplotlib the old tpot.png is removed)")
    args = ap.parse_args(argv)
    try:
        outputs = [("--out", args.out / name) for name in ("tpot.md", "tpot.png")]
        refuse_clobbering(outputs, [("a results file", p) for p in (*args.results, *([args.tp2] if args.tp2 else []))])
        refuse_filled_dir(args.out, "--out", args.force, "tpot.md and tpot.png")  # as `harness report`'s --out
        for flag, path in outputs:
            refuse_link(path, flag)
            check_writable(path, flag, args.force)
        text, bars = render(args.results, args.tp2)
        png = plot(bars)
        old_png = args.out / "tpot.png"
        stale = png is None and args.force and old_png.is_file()
        if stale:  # --force and no plot to replace it: the earlier one goes first, never left beside the new table
            try:
                old_png.unlink()
            except OSError as exc:
                raise HarnessError(f"--out {old_png}", f"cannot remove the earlier plot: {exc.strerror or exc}") from None
        args.out.mkdir(parents=True, exist_ok=True)
        # together, each in full before either is moved in: a failed plot or write leaves both files as they were (a stale
        # plot, removed above, stays gone)
        write_files({args.out / "tpot.md": text.encode(), **({args.out / "tpot.png": png} if png else {})}, "--out")
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    print(f"written: {args.out / 'tpot.md'}" + (f", {args.out / 'tpot.png'}" if png else f" (no plot: matplotlib missing{'; the earlier tpot.png removed' if stale else ''})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
