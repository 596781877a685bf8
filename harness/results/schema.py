"""The records of the JSON files the harness writes and reads back (results files, golden
manifests), checked with msgspec: types, bounded numbers, required fields. The same `Row` and
`Case` are written by `run --json` / `tpot --json` and read by `compare` and `report`. Unknown
fields are allowed (newer writers may add some); everything a reader uses is declared here.

Results files carry a schema version; an older version is upgraded on read (MIGRATIONS, one
function per version step, as asv's results files do). Each version is declared once, in VERSIONS
(its name, the field it added, its upgrade to the next), from which MIGRATIONS and INTRODUCED derive.
"""

from __future__ import annotations

import math
import numbers
import re
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_args

import msgspec

from harness.datafiles import MAX_INT_DIGITS, read_json
from harness.errors import HarnessError
from harness.results.metrics import METRICS

SCHEMA = "mla-harness-results/5"
SCHEMA_V1 = "mla-harness-results/1"
SCHEMA_V2 = "mla-harness-results/2"
SCHEMA_V3 = "mla-harness-results/3"
SCHEMA_V4 = "mla-harness-results/4"
Command = Literal["run", "tpot"]  # what measured a results file: `harness run` or `harness tpot`
Verdict = Literal["pass", "fail", "unsupported", "error"]
VERDICTS = get_args(Verdict)
CASE_FIELDS = ("command", "preset", "scenario", "scale", "slots", "layers", "backend", "kernel", "workload", "workload_v4")
ROW_CASE_FIELDS = ("preset", "scale", "scenario", "backend")  # the case fields every row repeats

BOUND = 1e300  # numbers are finite and well inside float64: 401-digit integers are rejected
Finite = Annotated[float, msgspec.Meta(ge=-BOUND, le=BOUND)]
NonNegative = Annotated[float, msgspec.Meta(ge=0, le=BOUND)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class ErrorStats(msgspec.Struct, frozen=True):
    """A verdict's error statistics against its golden: built by harness.verify.check, read back from results files."""

    max_abs: Annotated[float, msgspec.Meta(ge=0)] | None = None  # inf when outputs were non-finite
    max_rel: Annotated[float, msgspec.Meta(ge=0)] | None = None
    norm_rel: Annotated[float, msgspec.Meta(ge=0)] | None = None
    mismatches: Count | None = None
    total: Count | None = None
    matched_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    worst_index: tuple[Count, ...] | None = None
    nonfinite: Count | None = None


class Guard(msgspec.Struct):
    """A timing row's clock guard (harness.measure.clocks.guarded): `disturbed` says why its numbers are not
    trusted (compare does not judge the row), None when they are; the rest is the guard's readings."""

    disturbed: Annotated[str, msgspec.Meta(min_length=1)] | None = None


class Detail(msgspec.Struct):
    """The fields of a row's detail that readers use (a verdict's, a timing's guard; other metrics add their own)."""

    status: Verdict | None = None
    reason: str | None = None
    stats: ErrorStats | None = None
    unsupported: str | None = None
    guard: Guard | None = None


class Case(msgspec.Struct, forbid_unknown_fields=True):
    """What a results file measured: two files compare only when every field is equal.
    slots/layers are None only in a version-1 file whose command line did not give them. workload is
    the sha256 of what the names do not say (harness.results.document.workload_digest: the preset's
    and the scenario's definitions, tpot's model and flags; no prose such as a scenario's description);
    None in a file older than version 5. workload_v4 is a version-4 file's digest, which also took in the
    scenario's description: it compares with another version-4 file's only; None in every other file."""

    command: Command
    preset: str
    scenario: str
    scale: str
    slots: Count | None
    layers: Count | None
    backend: str
    kernel: str
    workload: Sha256 | None
    workload_v4: Sha256 | None


def sample_iqr(values) -> float | None:
    """What a row's `iqr` is: its samples' interquartile range (statistics.quantiles, n=4); None under 4
    samples (no spread to tell, not a spread of zero)."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _same_spread(recorded: float | None, spread: float | None, samples: list[float]) -> bool:
    """A recorded iqr is `spread`, the samples' own, up to rounding (relative to the samples' size: identical samples'
    quantiles may differ in their last bits); under 4 samples, null or the 0 `tpot` recorded before this rule."""
    if spread is None:
        return recorded is None or recorded == 0
    return recorded is not None and math.isclose(recorded, spread, rel_tol=1e-9, abs_tol=1e-9 * max(samples))


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


KEY_FIELDS = ("preset", "scale", "scenario", "strategy", "backend", "metric")  # a row's key, in order


@dataclass
class Row:
    """One (case, strategy, metric) result. Unit and direction come from the metric table
    (harness/results/metrics.py) when not given. Checked on construction and on read: a verdict is one
    of VERDICTS; a numeric metric's value is a finite number >= 0 (a timing's value and every
    sample > 0) and, with samples, their median and its iqr theirs (sample_iqr: what every writer records, and
    what `report` draws as whiskers); a verdict's detail
    matches Detail (its statistics non-negative, mismatches <= total) and its status is the verdict."""

    preset: str
    scale: str
    scenario: str
    strategy: str
    backend: str
    metric: str
    value: Finite | str | None
    unit: str | None = None
    better: Literal["lower", "higher"] | None = None
    iqr: NonNegative | None = None
    samples: list[Finite] = field(default_factory=list)
    detail: dict | None = None
    gating: bool | None = None  # written: whether the metric gates on the file's device type

    def __post_init__(self):
        for name in KEY_FIELDS:
            text = getattr(self, name)
            if isinstance(text, str) and not (text and text.isprintable()):
                raise ValueError(f"{name}: {text!r} is empty or holds a control character (a newline...): a row's key "
                                 "is printed on one line")
        declared = METRICS.get(self.metric)
        if declared is None:
            return  # an undeclared metric: refused when written, reported (never judged) when read
        self.better = self.better or declared.better
        self.unit = self.unit or declared.unit
        if self.metric == "verdict" and self.value not in VERDICTS:
            raise ValueError(f"value: a verdict is one of {', '.join(VERDICTS)}, got {self.value!r}")
        if declared.better is not None and self.value is not None:
            least = "> 0" if declared.timed else ">= 0"
            for name, v in (("value", self.value), *(("samples", s) for s in self.samples)):
                if not _number(v) or v < 0 or (declared.timed and v == 0):
                    raise ValueError(f"{name}: {self.metric} must be a finite number {least}, got {v!r}")
            if self.samples and not math.isclose(self.value, median := statistics.median(self.samples), rel_tol=1e-9):
                raise ValueError(f"value: {self.value!r} is not the median of its samples ({median!r})")
            if self.samples and not _same_spread(self.iqr, spread := sample_iqr(self.samples), self.samples):
                raise ValueError(f"iqr: {self.iqr!r} is not the interquartile range of its {len(self.samples)} samples ({spread!r})")
        if self.detail is not None:
            try:
                detail = msgspec.convert(self.detail, Detail)
            except msgspec.ValidationError as exc:
                message, _, path = str(exc).rpartition(" - at `$")
                raise ValueError(f"detail{path.rstrip('`')}: {message or exc}") from None
            if self.metric == "verdict" and detail.status is not None and detail.status != self.value:
                raise ValueError(f"detail.status: {detail.status!r} contradicts the verdict {self.value!r}")
            stats = detail.stats
            if stats is not None and None not in (stats.mismatches, stats.total) and stats.mismatches > stats.total:
                raise ValueError(f"detail.stats.mismatches: {stats.mismatches} is more than total {stats.total}")

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, name) for name in KEY_FIELDS)


class Environment(msgspec.Struct):
    """Where and with what the numbers were made: harness.measure.environment.environment() builds it, readers read it back."""

    git_commit: str | None = None  # "-dirty" when tracked files of the checkout had changes
    hostname: str | None = None
    platform: str | None = None
    device: str | None = None
    cpu: str | None = None
    cpu_count: Count | None = None
    python: str | None = None
    torch: str | None = None
    numpy: str | None = None
    triton: str | None = None  # the imported triton's __version__, else the installed distribution's
    harness: str | None = None  # the installed mla-harness distribution's version (git_commit says which code ran)
    harness_digest: str | None = None  # sha256 of the imported harness package's sources: which code ran, git or not
    flashinfer: str | None = None  # the imported flashinfer's __version__ (else the installed distribution's)
    flashinfer_path: str | None = None  # the imported flashinfer package's folder: your own build shows here
    sglang: str | None = None  # when the run imported SGLang (its strategies): its __version__, folder, commit
    sglang_path: str | None = None
    sglang_commit: str | None = None  # MLA_HARNESS_SGLANG_COMMIT (ci.sglang_gate), else its SGLang checkout's HEAD
    sglang_digest: str | None = None  # sha256 of the imported SGLang package's *.py files: which code ran, git or not
    gpu: str | None = None  # the GPU fingerprint (CUDA only): properties, then nvidia-smi's readings
    capability: str | None = None
    sm_count: Count | None = None
    gpu_memory_bytes: Count | None = None
    cuda: str | None = None
    driver: str | None = None
    clock_sm: str | None = None
    clock_mem: str | None = None
    clock_sm_max: str | None = None
    power_limit: str | None = None
    temperature: str | None = None
    copy_gbps: NonNegative | None = None  # the control copy's bandwidth, set by the command that measured it
    triton_interpret: str | None = None  # TRITON_INTERPRET when set: "1" runs the Triton kernels in the interpreter
    reference: str | None = None  # `run`: what its verdicts were checked against (the golden's folder and manifest_sha256, or live)


class ResultsFile(msgspec.Struct):
    """A results file (report also requires created, environment and repro)."""

    schema: Literal["mla-harness-results/5"]
    case: Case
    rows: list[Row]
    created: str | None = None
    environment: Environment | None = None
    repro: str | None = None

    def __post_init__(self):
        if self.created is not None:
            try:
                datetime.fromisoformat(self.created)
            except ValueError:
                raise ValueError(f"created: not an ISO timestamp: {self.created!r}") from None
        for i, row in enumerate(self.rows):
            for name in ROW_CASE_FIELDS:
                if getattr(row, name) != getattr(self.case, name):
                    raise ValueError(f"rows[{i}].{name}: {getattr(row, name)!r} is not the file's case.{name} "
                                     f"{getattr(self.case, name)!r}")
            declared = METRICS.get(row.metric)
            if declared is not None and self.case.command not in declared.commands:
                written = " and ".join(f"`harness {c}`" for c in sorted(declared.commands))
                raise ValueError(f"rows[{i}].metric: {row.metric!r} is written by {written}, never by the file's case.command "
                                 f"{self.case.command!r}: a row of another command's results")


class PoolScale(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    slots: Count
    num_layers: Count


class GoldenPreset(msgspec.Struct, forbid_unknown_fields=True):
    """A golden's record of its preset: harness.spec.presets.ModelPreset's fields and its sm_scale (Case.spec)."""

    name: str
    num_layers: Count
    num_heads_total: Count
    tp: Count
    qk_nope_head_dim: Count
    kv_lora_rank: Count
    qk_rope_head_dim: Count
    page_size: Count
    index_k_bytes: Count
    yarn_factor: Finite
    yarn_mscale_all_dim: Finite
    sm_scale: Finite


class GoldenFinish(msgspec.Struct, forbid_unknown_fields=True):
    after_step: Count
    request: Count


class GoldenScenario(msgspec.Struct, forbid_unknown_fields=True):
    """A golden's record of its scenario's definition (harness.spec.scenario.Scenario.to_dict without its prose)."""

    name: str
    seed: Count
    steps: Count
    kv_lens: list[Count]
    layout: str
    finish: list[GoldenFinish]
    slots: list[list[Count]]
    description: str = ""  # prose, no part of the case: a manifest written before it was left out records it


class GoldenVersions(msgspec.Struct, forbid_unknown_fields=True):
    torch: str
    numpy: str
    safetensors: str


class GoldenManifest(msgspec.Struct, forbid_unknown_fields=True):
    """Every field harness.verify.golden writes (compute and write), typed: a re-signed manifest with a field of
    another type (true for 1, 8.0 for 8) or one no writer writes is refused. Verify and run compare the case's
    values type-strictly besides (a float where the writer writes an int is another manifest)."""

    schema: str
    case: str
    preset: GoldenPreset
    scale: PoolScale
    scenario: GoldenScenario
    generator: str
    seed: Count
    reference_precision: str
    checked: list[tuple[Count, Count]]
    checked_request_ids: list[Count]
    inputs_sha256: Sha256
    outputs_sha256: Sha256
    created: str
    versions: GoldenVersions
    manifest_sha256: Sha256

    def __post_init__(self):
        try:
            datetime.fromisoformat(self.created)
        except ValueError:
            raise ValueError(f"created: not an ISO timestamp: {self.created!r}") from None


class SafetensorsTensor(msgspec.Struct, forbid_unknown_fields=True):
    """One tensor of a safetensors file's JSON header (a golden's outputs file): read before the file is hashed."""

    dtype: str
    shape: list[Count]
    data_offsets: tuple[Count, Count]


T = TypeVar("T")


POST_INIT = re.compile(r"^(?P<field>[\w.\[\]]+): (?P<message>.*) - at `\$(?P<path>[^`]*)`$", re.S)
MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>\w+)`(?: - at `\$(?P<path>[^`]*)`)?$")


def validate(doc, kind: type[T], where: str | Path, name: str | None = None) -> T:
    """`doc` (decoded JSON) checked against `kind`; a mismatch is one HarnessError whose path names
    the field (a record's own check says "field: message"; that field, or a missing one, joins the path)."""
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if m := POST_INIT.match(text):
            text = f"{m['message']} - at `${m['path']}.{m['field']}`"
        elif m := MISSING_FIELD.match(text):
            text = f"missing required field - at `${m['path'] or ''}.{m['field']}`"
        raise HarnessError(str(where), f"does not match the {name or kind.__name__} schema: {text}") from None


def _words(repro: str) -> list[str]:
    """A recorded command line's words (none when it does not parse)."""
    try:
        return shlex.split(repro)
    except ValueError:
        return []


def _flag(repro: str, name: str) -> str | None:
    """The value argparse took for `--name V` / `--name=V` in a recorded command line, or None: the last one given, and
    an abbreviation counts (argparse took one that named a single option)."""
    words, value = _words(repro), None
    for i, word in enumerate(words):
        option, eq, given = word.partition("=")
        if len(option) > 2 and name.startswith(option):
            value = given if eq else words[i + 1] if i + 1 < len(words) else value
    return value


def _count(text: str | None) -> int | None:
    ok = text is not None and text.isascii() and text.isdigit() and len(text) <= MAX_INT_DIGITS  # "²".isdigit(), but int() refuses it
    return int(text) if ok else None


class _RowsV1(msgspec.Struct):
    rows: list[Row]


def _v1_to_v2(doc: dict, where: str) -> dict:
    """Version 1 has no case record: it is read from the rows (which must agree on it) and the
    recorded command line (--slots, --layers, --kernel; slots/layers None when not given)."""
    rows = validate(doc, _RowsV1, where, ResultsFile.__name__).rows
    if not rows:
        raise HarnessError(f"{where}: rows", "empty: a version-1 file's case is read from its rows")
    case = {}
    for name in ROW_CASE_FIELDS:
        seen = sorted({getattr(r, name) for r in rows})
        if len(seen) != 1:
            raise HarnessError(f"{where}: rows[].{name}", f"a version-1 file of several cases ({', '.join(seen)}) cannot be upgraded")
        case[name] = seen[0]
    repro = doc.get("repro") if isinstance(doc.get("repro"), str) else ""
    case.update(slots=_count(_flag(repro, "--slots")), layers=_count(_flag(repro, "--layers")),
                kernel=_flag(repro, "--kernel") or "auto")
    return {**doc, "schema": SCHEMA_V2, "case": case}


def _v2_to_v3(doc: dict, where: str) -> dict:
    """Version 2's case does not say which command measured it: the subcommand of the recorded command
    line (`python -m harness tpot ...`), else `tpot` when a row holds tpot_ms, else `run`."""
    words = _words(doc.get("repro") if isinstance(doc.get("repro"), str) else "")
    command = words[3] if words[:3] == ["python", "-m", "harness"] and len(words) > 3 and words[3] in get_args(Command) else None
    if command is None:
        rows = doc.get("rows") if isinstance(doc.get("rows"), list) else []
        command = "tpot" if any(isinstance(r, dict) and r.get("metric") == "tpot_ms" for r in rows) else "run"
    case = doc.get("case")
    return {**doc, "schema": SCHEMA_V3, "case": {**case, "command": command} if isinstance(case, dict) else case}


def _v3_to_v4(doc: dict, where: str) -> dict:
    """Version 3's case names its workload but does not fingerprint it: workload None (not recorded),
    which compares equal only to another file without one."""
    case = doc.get("case")
    return {**doc, "schema": SCHEMA_V4, "case": {**case, "workload": None} if isinstance(case, dict) else case}


def _v4_to_v5(doc: dict, where: str) -> dict:
    """Version 4's workload digest also took in the scenario's description: it moves to workload_v4, which
    compares with another version-4 file's only, and workload is None (not recorded)."""
    case = doc.get("case")
    if isinstance(case, dict) and "workload" in case:  # one without is refused, naming the field
        case = {**case, "workload": None, "workload_v4": case["workload"]}
    return {**doc, "schema": SCHEMA, "case": case}


@dataclass(frozen=True)
class SchemaVersion:
    """One results schema version: its name, the field it added (None for the first) and its upgrade to the next
    version (None for the current one, SCHEMA)."""

    name: str
    introduced: str | None
    upgrade: Callable[[dict, str], dict] | None


VERSIONS = (  # oldest first, SCHEMA last: a new version is one line here (and the upgrade of the one before it)
    SchemaVersion(SCHEMA_V1, None, _v1_to_v2),
    SchemaVersion(SCHEMA_V2, "case", _v2_to_v3),
    SchemaVersion(SCHEMA_V3, "case.command", _v3_to_v4),
    SchemaVersion(SCHEMA_V4, "case.workload", _v4_to_v5),
    SchemaVersion(SCHEMA, "case.workload_v4", None),
)
MIGRATIONS = {v.name: v.upgrade for v in VERSIONS if v.upgrade is not None}  # schema version -> its upgrade to the next version
INTRODUCED = {v.name: v.introduced for v in VERSIONS if v.introduced is not None}  # version -> the field it added


def _carries(doc: dict, name: str) -> bool:
    outer, _, inner = name.partition(".")
    return outer in doc if not inner else isinstance(doc.get(outer), dict) and inner in doc[outer]


def _check_relabelled(doc, where: str) -> None:
    """Bad input: an older version's document carrying a field a later version added (a newer file relabelled, which
    the migrations would misread: v3 -> v4 drops case.workload)."""
    declared = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(declared, str) or declared not in MIGRATIONS:
        return
    order = [v.name for v in VERSIONS]
    for version, name in INTRODUCED.items():
        if order.index(version) > order.index(declared) and _carries(doc, name):
            raise HarnessError(f"{where}: schema", f"{declared!r} has no {name} ({version!r} added it): "
                                                   "a newer file relabelled is not read")


def upgrade(doc, where: str):
    """A decoded results document at the current schema version (older versions upgraded; a relabelled one refused)."""
    _check_relabelled(doc, where)
    seen = set()
    while isinstance(doc, dict) and isinstance(doc.get("schema"), str) and doc["schema"] in MIGRATIONS and doc["schema"] not in seen:
        seen.add(doc["schema"])
        doc = MIGRATIONS[doc["schema"]](doc, where)
    if not isinstance(doc, dict):
        raise HarnessError(where, f"top level must be an object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise HarnessError(f"{where}: schema", f"expected {SCHEMA!r} (or {', '.join(map(repr, MIGRATIONS))}), "
                                              f"got {doc.get('schema')!r}")
    return doc


def parse_results(doc, where: str | Path) -> ResultsFile:
    """A decoded results document, upgraded and checked; errors name the file and the field."""
    return validate(upgrade(doc, str(where)), ResultsFile, where)


def read_results(path: str | Path) -> ResultsFile:
    return parse_results(read_json(path), path)
