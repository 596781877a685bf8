"""Proof of GPU binding: what each pytest process ran on, and the check that workers own their GPUs.

With ``--binding-proof DIR`` every test process (each xdist worker, or the one process without
xdist) writes ``DIR/<worker>.json`` at session end, while its CUDA context is still alive:
the CUDA_VISIBLE_DEVICES entry it was bound to, how many devices its CUDA runtime saw, the UUID
of the device each ``gpu`` test ran on, the GPUs on which its pid holds a CUDA context (NVML's
per-GPU process list, or ``nvidia-smi --query-compute-apps``), and a timeline (process start,
first test, session end) that shows what start-up costs, and the pools it built per case
(harness.execute.prepared.PreparedCase.builds). After the workers finish, the
controller runs `check` over the records: every worker ran on the GPU its binding names, two
workers never share one GPU unless there are more workers than GPUs, and no worker holds a
context on a GPU it does not own; on a GPU runner (--gpu-runner) every test process ran a gpu test. Problems fail the session; the verdict lands in ``DIR/check.json``.

GPU enumeration goes through `PROBE` (an `NvmlProbe`), which tests replace with a fake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHECK_FILE = "check.json"


def normalize_uuid(uuid: object) -> str:
    """'GPU-9A2B...' (NVML, nvidia-smi) and '9a2b...' (torch) -> '9a2b...'."""
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def parse_smi_csv(text: str, columns: int) -> list[list[str]]:
    """Rows of `nvidia-smi --format=csv,noheader` output (lines without `columns` fields are skipped)."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines()]
    return [row for row in rows if len(row) == columns and all(row)]


def nvidia_smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args, "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=30, check=True).stdout


class NvmlProbe:
    """The machine's GPUs through NVML (pynvml / nvidia-ml-py), else nvidia-smi; never initialises CUDA."""

    source = "nvml"

    def __init__(self, smi: Callable[..., str] = nvidia_smi):
        self._smi = smi
        try:
            import pynvml  # noqa: F401
        except ImportError:
            self.source = "nvidia-smi"

    def gpu_uuids(self) -> dict[str, str]:
        """NVML index (PCI bus order) -> normalized UUID; {} when no GPU or no tool is there."""
        try:
            if self.source == "nvml":
                return {str(i): normalize_uuid(u) for i, u, _ in self._nvml()}
            return {i: normalize_uuid(u) for i, u in parse_smi_csv(self._smi("--query-gpu=index,uuid"), 2)}
        except Exception:
            return {}

    def compute_apps(self) -> list[tuple[int, str]] | None:
        """(pid, GPU UUID) of every process holding a CUDA context; None when it cannot be listed."""
        try:
            if self.source == "nvml":
                return [(pid, normalize_uuid(u)) for _, u, pids in self._nvml() for pid in pids]
            return [(int(p), normalize_uuid(u)) for p, u in parse_smi_csv(self._smi("--query-compute-apps=pid,gpu_uuid"), 2)]
        except Exception:
            return None

    @staticmethod
    def _nvml() -> list[tuple[int, str, list[int]]]:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
                out.append((i, uuid.decode() if isinstance(uuid, bytes) else uuid, pids))
            return out
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def current_uuid() -> str | None:
        """UUID of the device this process's torch is using, or None if it never initialised CUDA."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        return normalize_uuid(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)

    @staticmethod
    def visible_count() -> int | None:
        """Devices this process's CUDA runtime sees (None if it never initialised CUDA)."""
        torch = sys.modules.get("torch")
        return torch.cuda.device_count() if torch is not None and torch.cuda.is_initialized() else None


PROBE = NvmlProbe()


def resolve(entry: str, gpus: Mapping[str, str]) -> str | None:
    """The UUID a CUDA_VISIBLE_DEVICES entry names: an NVML index, or a unique GPU-<uuid> prefix."""
    if entry.isdigit():
        return gpus.get(entry)
    prefix = normalize_uuid(entry)
    matches = [u for u in gpus.values() if u.startswith(prefix)] if entry.lower().startswith("gpu-") else []
    return matches[0] if len(matches) == 1 else None


def process_start_time() -> float | None:
    """When this process started (epoch seconds), from /proc; None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@dataclass
class Record:
    """What one test process ran on; written as DIR/<worker>.json."""

    worker: str
    pid: int
    bound: str | None  # the CUDA_VISIBLE_DEVICES entry the plugin bound it to (None: not bound)
    visible_count: int | None = None  # devices its CUDA runtime saw (None: CUDA never initialised)
    ran_on: dict[str, int] = field(default_factory=dict)  # GPU UUID -> gpu tests that ran there
    contexts: list[str] | None = None  # GPUs where this pid holds a CUDA context (None: not listable)
    context_probe: str = ""
    timeline: dict[str, float | None] = field(default_factory=dict)  # epoch seconds
    test_seconds: float = 0.0  # setup + call + teardown of every test it ran
    pinned_cpus: list[int] | None = None  # cores it was pinned to (--pin-cpus); None: not pinned
    torch_threads: int | None = None  # its share of the cores (cpu_affinity.share_cpus); None: not set
    pool_builds: dict[str, int] = field(default_factory=dict)  # case -> pools this process built

    def note_test(self, uuid: str | None) -> None:
        if uuid is not None:
            self.ran_on[uuid] = self.ran_on.get(uuid, 0) + 1

    def finish(self, probe) -> None:
        """Fill what is known only at session end: device count, pools built, this pid's contexts."""
        self.visible_count = probe.visible_count()
        prepared = sys.modules.get("harness.execute.prepared")
        self.pool_builds = dict(prepared.PreparedCase.builds) if prepared is not None else {}
        apps = probe.compute_apps()
        if apps is None:
            self.context_probe = f"{probe.source}: process list unavailable"
            return
        mine = sorted({uuid for pid, uuid in apps if pid == self.pid})
        if not mine and self.ran_on:
            self.context_probe = f"{probe.source}: pid {self.pid} not listed (PID namespace?)"
            return
        self.contexts, self.context_probe = mine, probe.source

    def write(self, directory: Path) -> Path:
        path = directory / f"{self.worker}.json"
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        return path


def load_records(directory: Path) -> list[Record]:
    return [Record(**json.loads(p.read_text())) for p in sorted(directory.glob("*.json")) if p.name != CHECK_FILE]


@dataclass
class Verdict:
    problems: list[str]
    notes: list[str]
    ran_on: dict[str, str | None]  # worker -> the one GPU it ran its gpu tests on

    @property
    def ok(self) -> bool:
        return not self.problems


def check(records: Sequence[Record], expected: Mapping[str, str | None], visible: Iterable[str],
          require_gpu_tests: bool = False) -> Verdict:
    """Workers against their binding. `expected`: worker -> UUID its binding names (None: unknown or
    not bound; every worker of the run must be a key); `visible`: UUIDs of the parent's GPUs.
    `require_gpu_tests` (a GPU runner, --gpu-runner): a test process that ran no gpu test is a problem (its GPU
    unusable, or every test it got skipped), not a note."""
    visible = set(visible)
    problems, notes, ran = [], [], {}
    by_worker = {r.worker: r for r in records}
    problems += [f"{w}: wrote no record" for w in sorted(expected.keys() - by_worker.keys())]
    for r in sorted(records, key=lambda r: r.worker):
        gpus = sorted(r.ran_on)
        ran[r.worker] = gpus[0] if len(gpus) == 1 else None
        own = expected.get(r.worker)
        if not gpus:
            (problems if require_gpu_tests else notes).append(f"{r.worker}: ran no gpu test")
        elif len(gpus) > 1:
            problems.append(f"{r.worker}: ran gpu tests on {len(gpus)} GPUs: {', '.join(gpus)}")
        elif own is not None and gpus[0] != own:
            problems.append(f"{r.worker}: bound to {r.bound} ({own}) but ran on {gpus[0]}")
        elif visible and gpus[0] not in visible:
            problems.append(f"{r.worker}: ran on {gpus[0]}, which the parent's CUDA_VISIBLE_DEVICES does not list")
        owned = {own} if own is not None else set(gpus)
        if r.contexts is None:
            if gpus:
                notes.append(f"{r.worker}: contexts not verified ({r.context_probe}); its CUDA runtime saw "
                             f"{r.visible_count} device(s)")
        elif (foreign := sorted(set(r.contexts) - owned)) and r.bound is None:
            notes.append(f"{r.worker}: not bound to a GPU; CUDA contexts also on {', '.join(foreign)}")
        elif foreign:
            problems.append(f"{r.worker}: CUDA context on GPU(s) it does not own: {', '.join(foreign)}")
        if r.bound is not None and r.visible_count not in (None, 1):
            problems.append(f"{r.worker}: bound to {r.bound} but its CUDA runtime saw {r.visible_count} devices")
    planned = [u for u in expected.values() if u is not None]
    planned_sharing = len(set(planned)) < len(planned) or (bool(visible) and len(expected) > len(visible))
    by_gpu: dict[str, list[str]] = {}
    for worker, uuid in ran.items():
        if uuid is not None:
            by_gpu.setdefault(uuid, []).append(worker)
    for uuid, workers in sorted(by_gpu.items()):
        if len(workers) > 1 and not planned_sharing:
            problems.append(f"{', '.join(workers)} all ran on {uuid}")
    return Verdict(problems, notes, ran)


def expected_uuids(assignment: Mapping[str, str | None], gpus: Mapping[str, str]) -> dict[str, str | None]:
    """worker -> UUID of its planned CUDA_VISIBLE_DEVICES entry (None when it cannot be resolved)."""
    return {w: (resolve(entry, gpus) if entry is not None else None) for w, entry in assignment.items()}


def timeline_summary(records: Sequence[Record], controller_start: float | None, end: float) -> dict[str, dict]:
    """Per worker: start-up (process start -> first test), test seconds, session end -> run end, and
    the pools it built per case and its torch threads."""
    out = {}
    for r in records:
        t = r.timeline
        start, first = t.get("process_start"), t.get("first_test")
        out[r.worker] = {
            "spawned_after_s": round(start - controller_start, 2) if start and controller_start else None,
            "startup_s": round(first - start, 2) if first and start else None,
            "test_s": round(r.test_seconds, 2),
            "first_to_last_test_s": round(t["last_test_end"] - first, 2) if first and t.get("last_test_end") else None,
            "session_end_to_run_end_s": round(end - t["session_end"], 2) if t.get("session_end") else None,
            "pool_builds": dict(r.pool_builds),
            "torch_threads": r.torch_threads,
        }
    return out


def write_check(directory: Path, verdict: Verdict, expected: Mapping, visible: Iterable[str], timeline: Mapping) -> Path:
    path = directory / CHECK_FILE
    path.write_text(json.dumps({"ok": verdict.ok, "problems": verdict.problems, "notes": verdict.notes,
                                "ran_on": verdict.ran_on, "expected": dict(expected), "visible": sorted(visible),
                                "timeline": dict(timeline), "written": time.time()}, indent=1, sort_keys=True))
    return path
