"""The metric table: every metric a results file may carry, declared once.

Each declaration gives the unit, which direction is better, where the metric gates
(device types whose numbers `compare` may fail a build on; empty = informational
everywhere), which commands write it (`harness run`, `harness tpot`: a results file holds its own
command's metrics only), whether its samples are timings (judged by the confidence-interval
rule) or exact values (judged by the factor alone), and how it is printed.
Timed metrics gate only where they are device-timed (CUDA events): on a CPU runner
they are host wall time, which a neighbour can move 10-50x, so they inform only.
results, compare, report and the console table read this table; writing a row whose
metric is not declared here is an error (`validate_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import HarnessError

CUDA = frozenset({"cuda"})
EVERYWHERE = frozenset({"cpu", "cuda"})
NOWHERE: frozenset[str] = frozenset()
RUN, TPOT = frozenset({"run"}), frozenset({"tpot"})  # the commands that write a metric


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str | None
    better: str | None  # "lower", "higher", or None for a non-numeric metric (verdict)
    gates_on: frozenset[str]  # device types where a regression fails the gate
    commands: frozenset[str]  # the commands (schema.Case.command) whose results files carry it
    timed: bool  # samples are timings: judged by the CI rule, not by value alone
    fmt: str  # format spec of the value ("bytes": GiB/MiB)
    description: str
    resolution: float = 0.0  # absolute change (in `unit`) below which a timing is not judged a regression
    no_asv: str = ""  # why no asv benchmark tracks it, for a metric that gates on CUDA (else suites/asv/ has its class)

    def gates(self, device_type: str) -> bool:
        return device_type in self.gates_on

    def format(self, value) -> str:
        if value is None:
            return "-"
        if self.fmt == "bytes":
            return f"{value / 1024**3:.2f} GiB" if value >= 1024**3 else f"{value / 1024**2:.1f} MiB"
        return format(value, self.fmt) if self.fmt and isinstance(value, (int, float)) else str(value)


def readable(value: float, spec: str) -> str:
    """`value` as `spec`, or to two significant digits where `spec` would round a nonzero value to zero (a percentage
    stays one): the reports never print a measured figure as 0."""
    text = format(value, spec)
    if not value or any(c in "123456789" for c in text):
        return text
    return format(value * 100, ".2g") + "%" if spec.endswith("%") else format(value, ".2g")


def _m(name, unit, better, gates_on, commands, timed, fmt, description, resolution=0.0, no_asv="") -> Metric:
    return Metric(name, unit, better, gates_on, commands, timed, fmt, description, resolution, no_asv)


# Microsecond kernels replayed in a graph move between runs by more than their within-run spread
# (H200 A/A, 2026-11-30: gather_cast's 2.7 us cast flagged at 5% in 3 of 15 same-commit pairs while
# its IQR/median was 0.5-1.8%); a change under half a microsecond is below what they resolve.
KERNEL_RESOLUTION_US = 0.5


METRICS: dict[str, Metric] = {m.name: m for m in (
    _m("verdict", None, None, EVERYWHERE, RUN, False, "", "golden/bitwise check: pass, fail, error, unsupported",
       no_asv="not a number: the GPU suite and `harness compare` gate it"),
    _m("timing", None, None, NOWHERE, RUN, False, "", "why timing could not run (a row with no value)"),
    _m("cast_us", "us", "lower", CUDA, RUN, True, ".1f", "layer 0's cast/gather kernel alone, per layer", KERNEL_RESOLUTION_US),
    _m("cast_gbps", "GB/s", "higher", NOWHERE, RUN, True, ".0f", "cast bytes / cast_us (derived from cast_us, which gates)"),
    _m("attn_us", "us", "lower", CUDA, RUN, True, ".1f", "layer 0's attention kernel alone, per layer", KERNEL_RESOLUTION_US),
    _m("step_ms", "ms", "lower", NOWHERE, RUN, True, ".3f", "whole decode step end to end: host plan + launch + graph replay"),
    _m("step_eager_ms", "ms", "lower", NOWHERE, RUN, True, ".3f", "the same step launched eagerly (host bound)"),
    _m("step_device_ms", "ms", "lower", CUDA, RUN, True, ".3f", "the step's CUDA-graph replay alone (device time)"),
    _m("step_host_ms", "ms", "lower", NOWHERE, RUN, True, ".3f", "the step's host work: plan + launch"),
    _m("tpot_ms", "ms", "lower", CUDA, TPOT, True, ".3f", "time per output token of the model-shaped step"),
    _m("attn_path_ms", "ms", "lower", NOWHERE, TPOT, True, ".3f", "tpot's attention path alone (writes, casts, attention), graph-replayed"),
    _m("roofline_ms", "ms", "lower", NOWHERE, TPOT, False, ".3f", "tpot's weight + KV + cast bytes at the measured copy bandwidth"),
    _m("tpot_over_roofline", "ratio", "lower", NOWHERE, TPOT, True, ".2f", "tpot_ms / roofline_ms"),
    _m("step_weight_bytes", "B", "lower", NOWHERE, TPOT, False, "bytes", "weight bytes one model step reads"),
    _m("step_kv_bytes", "B", "lower", NOWHERE, TPOT, False, "bytes", "KV bytes one model step reads"),
    _m("step_cast_bytes", "B", "lower", NOWHERE, TPOT, False, "bytes", "cast bytes (read + write) one model step moves"),
    _m("rotation_check", "ratio", None, NOWHERE, TPOT, False, ".3f", "rotated / fully distinct weights step time (L2 reuse check)"),
    _m("attn_share", "ratio", "higher", NOWHERE, TPOT, True, ".1%", "attention's share of the step"),
    _m("control_copy_gbps", "GB/s", "higher", NOWHERE, RUN | TPOT, True, ".0f",
       "control: copy bandwidth of a fixed buffer, measured in the same run (environment guard)"),
    _m("bytes_moved", "B", "lower", NOWHERE, RUN, False, "bytes", "bytes one step must move (roofline numerator)"),
    _m("floor_us", "us", "lower", NOWHERE, RUN, False, ".1f", "bytes_moved at copy bandwidth: the roofline floor"),
    _m("floor_ratio", "x", "lower", NOWHERE, RUN, True, ".2f", "measured time / roofline floor"),
    _m("extra_bytes", "B", "lower", EVERYWHERE, RUN, False, "bytes", "device memory the strategy adds (computed)",
       no_asv="computed from the strategy's buffers, not measured: `harness compare` gates it; peak_bytes is asv's"),
    _m("peak_bytes", "B", "lower", CUDA, RUN, False, "bytes", "peak device memory allocated while decoding"),
    _m("build_s", "s", "lower", NOWHERE, RUN, True, ".2f", "pool build time, one host-timed sample with kernel loading"),
)}


def spec(name: str, where: str = "metric") -> Metric:
    """The declaration of `name`; an undeclared metric is an error naming it."""
    try:
        return METRICS[name]
    except KeyError:
        raise HarnessError(where, f"metric {name!r} is not declared in harness/results/metrics.py") from None


def validate_rows(rows) -> None:
    """Every row's metric is declared, and its unit and direction agree with the declaration."""
    for i, row in enumerate(rows):
        where = f"rows[{i}] ({row.strategy}/{row.metric})"
        m = spec(row.metric, where)
        if row.better != m.better or (row.value is not None and row.unit != m.unit):
            raise HarnessError(where, f"unit/better {row.unit!r}/{row.better!r} disagree with the table's "
                                      f"{m.unit!r}/{m.better!r}")
