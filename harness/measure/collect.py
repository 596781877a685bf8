"""Timing one strategy's decode step (the metrics `harness run`, asv and the perf tests report).

cast_us, attn_us: layer 0's cast/gather kernel and attention kernel alone. On CUDA the step is
replayed the way SGLang's decode runner does it: one CUDA graph per batch-size bucket, the
step's inputs copied into the captured buffers and the plan refreshed through FlashInfer's
fast path before each replay (`decode.BucketGraph`). From that:
  step_device_ms  the graph replay alone (CUDA events around the replay; the GATING step metric)
  step_host_ms    host time of the replay preparation and the launch (informational)
  step_ms         end to end: preparation + replay, from an idle GPU (CUDA events)
  step_eager_ms   the same layer loop launched eagerly, with a full plan (informational)
On the CPU there is no graph: step_ms is the host time of one eager step.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from harness.errors import out_of_memory
from harness.execute.decode import DecodeSession
from harness.measure import clocks, timing
from harness.results.metrics import spec

WARMUP_REPLAYS = 10
LAUNCH_COVER_CYCLES = 1_000_000  # ~0.5 ms of GPU spin so the replay is queued before its start event fires
PER_MS = {"s": 1e-3, "ms": 1.0, "us": 1e3}  # a timing block's milliseconds in each time unit a metric may declare


def one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def guarded(block, device: torch.device):
    """(block(), guard): THE single call point of the environment guard around every timing block.
    harness.measure.clocks reads clocks, temperature, throttle reasons and other GPU processes before and
    after, and re-runs a disturbed block once; guard (JSON-ready) goes into the metric rows' detail."""
    return clocks.guarded(block, device)


@dataclass
class Measured:
    metrics: dict[str, timing.Samples] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it was not measured
    guards: dict[str, dict] = field(default_factory=dict)  # metric -> clock guard of its timing block


def bucket_replay_ms(session: DecodeSession, batch, repeats: int) -> dict[str, list[float]]:
    """{step_device_ms, step_host_ms, step_ms} samples of `batch` replayed through its bucket graph."""
    graph = session.bucket_graph(batch)
    for _ in range(WARMUP_REPLAYS):
        graph.load(batch)
        graph.replay()

    def load_behind_busy_gpu():  # device: the GPU is kept busy while the host prepares and launches
        graph.load(batch)
        torch.cuda._sleep(LAUNCH_COVER_CYCLES)

    device = timing.event_time_ms(graph.replay, repeats, warmup=0, queued=True, before=load_behind_busy_gpu)
    host, whole = timing.idle_start_ms(lambda: (graph.load(batch), graph.replay()), repeats)  # each from an idle GPU
    return {"step_device_ms": device, "step_host_ms": host, "step_ms": whole}


@dataclass(frozen=True)
class Layer0:
    """Layer 0's kernels of the last step, as `measure` times them (and a profiler replays them): the cast
    or gather (fn, tensors) and the attention (fn, args), each called as fn(*args)."""

    cast: tuple
    attend: tuple
    cast_bytes: int


def layer0(session: DecodeSession) -> Layer0:
    """Plan the last step and make layer 0's calls; the attention reads the cast's output buffer."""
    s, last = session.strategy, session.schedule.steps[-1]
    plan = s.begin_step(last)
    q = (session.data.steps[last.step].q_nope[0], session.data.steps[last.step].q_pe[0])
    fn, tensors = s.cast_call(0)
    rows = fn(*tensors)  # layer 0's [rows, 1, 576] buffer the kernel reads (prepare_kv's, before the split)
    # the cold-L2 clones are of the whole row buffer, so the kernel reads SGLang's layout (576-byte
    # rows); clones of the (ckv, kpe) views would be two separate arrays, a layout no server has
    attend = lambda qn, qp, kv_rows: s.attend(plan, qn, qp, s.split(kv_rows))  # noqa: E731
    return Layer0((fn, tensors), (attend, (*q, rows)), type(s).cast_bytes(s.pool.geometry, last))


def measure(session: DecodeSession, repeats: int, phase=None) -> Measured:
    """Metrics of the last step, each timing block under the clock guard. `phase(total)`, when given, is a progress
    context (harness.progress.progress_bar) whose advance() is called after each of the `total` timing blocks."""
    s, last = session.strategy, session.schedule.steps[-1]
    calls = layer0(session)
    (fn, tensors), (attend, attend_args), cast_bytes = calls.cast, calls.attend, calls.cast_bytes
    blocks = {}  # metric -> block returning {metric: ms samples}
    if s.device.type != "cuda":
        if cast_bytes:
            blocks["cast_us"] = lambda: timing.host_time_ms(lambda: fn(*tensors), repeats)
        blocks["attn_us"] = lambda: timing.host_time_ms(lambda: attend(*attend_args), repeats)
        blocks["step_ms"] = lambda: timing.host_time_ms(lambda: session.step(last), repeats)
    else:
        if cast_bytes:
            blocks["cast_us"] = lambda: timing.device_time_ms(fn, repeats, use_cuda_graph=True, input_args=tensors)
        blocks["attn_us"] = lambda: timing.device_time_ms(attend, repeats, use_cuda_graph=True, input_args=attend_args)
        blocks["step_eager_ms"] = lambda: timing.device_time_ms(lambda: session.step(last), repeats)
        blocks["step_device_ms"] = lambda: bucket_replay_ms(session, last, repeats)
    out = Measured(skipped={} if cast_bytes else {"cast_us": s.cast_untimed or f"{s.name} has no per-step cast kernel"})
    with (phase or _no_progress)(len(blocks)) as advance:
        _time_blocks(blocks, s.device, out, advance)
    if cast_bytes:
        out.metrics["cast_gbps"] = timing.Samples("GB/s", tuple(cast_bytes / (t * 1e-6) / 1e9 for t in out.metrics["cast_us"].values))
    return out


@contextmanager
def _no_progress(total: int):
    yield lambda: None


def _time_blocks(blocks: dict, device: torch.device, out: Measured, advance) -> None:
    """Run each timing block under the guard into `out` (its ms samples in each metric's declared unit), advance() after each."""
    for name, block in blocks.items():
        try:
            samples, guard = guarded(block, device)
        except Exception as exc:  # only the bucket graph may fail here: a backend or strategy that cannot be captured
            if name != "step_device_ms" or out_of_memory(exc):
                raise
            out.skipped.update({m: f"not graph-replayable: {one_line(exc)}" for m in ("step_device_ms", "step_host_ms", "step_ms")})
        else:
            for metric, ms in (samples.items() if isinstance(samples, dict) else [(name, samples)]):
                unit = spec(metric).unit
                out.metrics[metric] = timing.Samples(unit, tuple(t * PER_MS[unit] for t in ms))
                out.guards[metric] = guard
        advance()
