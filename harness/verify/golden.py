"""Golden files: float64-reference outputs in safetensors plus a JSON manifest per case.

golden/<case>/outputs.safetensors holds, for each checked (step, layer):
  s{step}.l{layer}.out_bf16 / .out_fp32 [R, H, 512] and .lse [R, H] (natural log),
and s{step}.positions [R] (the checked requests' positions in that step's batch).
The manifest records the case spec, generator version, sha256 of the inputs read
and of the outputs file, and manifest_sha256 over every other manifest field: a verdict
depends on nothing that no hash covers. Inputs are never stored: the generator recreates them.

A refresh replaces the case folder by two renames under a lock (golden/.refresh.lock), through folders
`.<case>.new-*` and `.<case>.old-*` it marks as its own (MARK, naming the folder) before it fills them, and
unmarks the new golden only once it is the case folder; a refresh killed between the renames leaves the previous
golden in `.<case>.old-*/<case>`, which the next load or refresh puts back (a rename: a load deletes nothing); a
refresh killed while writing or swapping leaves `.<case>.new-*`, one killed or failed before the first rename a
`.<case>.old-*` holding only the mark, and one killed after the last rename the mark in the case folder: the next
refresh removes them. A refresh deletes a folder of its own with the mark last, moved beside the emptied folder
(`.mla-harness-refresh.<case>.new-*` or `.old-*`, still naming it) before that goes (`_discard`): killed at any
point of a deletion, what remains is still marked, and the next refresh removes it. A folder of such a name without
the mark, or holding anything a refresh does not write, is the user's: no command moves or removes it.

`run` checks outputs against out_fp32 (the float64 reference rounded once, the tolerances'
reference); out_bf16 is its BF16 rounding, which verify compares bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from harness.datafiles import DuplicateKey, read_json, unique_keys
from harness.errors import HarnessError
from harness.fsio import share_folder, write_bytes, write_text
from harness.inputs.cases import Case, checked_positions, golden_dir
from harness.inputs.reference import mla_decode_f64, step_inputs
from harness.results.schema import GoldenManifest, SafetensorsTensor, validate
from harness.spec.scenario import SCENARIO_DIR, definition

MANIFEST = "manifest.json"
OUTPUTS = "outputs.safetensors"
SCHEMA = "mla-harness-golden/2"
LOCK = ".refresh.lock"
MARK = ".mla-harness-refresh"  # in a refresh's own temporary folder, holding the folder's name
LOCK_TIMEOUT_S = 600
# Two float64 references agree to ~1e-15; after rounding to fp32 they may differ by one ulp.
RECOMPUTE_RTOL = 2.5e-7
RECOMPUTE_ATOL = 1e-9
# dtype and rank of each stored tensor, by its name's last part
TENSOR_TYPES = {"positions": (torch.int64, 1), "out_bf16": (torch.bfloat16, 3), "out_fp32": (torch.float32, 3), "lse": (torch.float32, 2)}
SAFETENSORS_DTYPE = {torch.int64: "I64", torch.bfloat16: "BF16", torch.float32: "F32"}  # safetensors' header names
ITEM_BYTES = {SAFETENSORS_DTYPE[dtype]: dtype.itemsize for dtype, _ in TENSOR_TYPES.values()}  # per header name
HEADER_LIMIT = 100_000_000  # safetensors' own bound on a header's bytes
NOT_REGULAR = "not a regular file (a folder, a device, a dangling link...)"  # why a manifest or outputs path that exists is refused


@dataclass
class GoldenData:
    tensors: dict[str, torch.Tensor]
    manifest: dict

    def out(self, step: int, layer: int) -> torch.Tensor:
        return self.tensors[f"s{step}.l{layer}.out_fp32"]

    def lse(self, step: int, layer: int) -> torch.Tensor:
        return self.tensors[f"s{step}.l{layer}.lse"]

    def positions(self, step: int) -> np.ndarray:
        return self.tensors[f"s{step}.positions"].numpy()

    def keys(self) -> list[tuple[int, int]]:
        return [tuple(k) for k in self.manifest["checked"]]


def _root(root: Path | None) -> Path:
    """The golden folder: `root`, else the configured one (read at call time)."""
    return golden_dir() if root is None else root


def case_dir(case_name: str, root: Path | None = None) -> Path:
    return _root(root) / case_name


def _checked_inputs(case: Case):
    """(step, layer, positions, inputs) of every checked (step, layer), in the golden's order."""
    request_ids = case.checked_request_ids()
    for batch in case.schedule().steps:
        positions = checked_positions(batch, request_ids)
        for layer in case.checked_layers():
            yield batch.step, layer, positions, step_inputs(case.preset, case.scenario.seed, batch, layer, positions)


def _hash_inputs(h, inputs) -> None:
    for t in (inputs.q_nope, inputs.q_pe, *inputs.rows):
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())


def inputs_digest(case: Case) -> str:
    """sha256 of the inputs the case's checked (step, layer)s read: the manifest's inputs_sha256."""
    h = hashlib.sha256()
    for *_, inputs in _checked_inputs(case):
        _hash_inputs(h, inputs)
    return h.hexdigest()


def compute(case: Case, progress=None) -> GoldenData:
    """Run the float64 reference for the case's checked layers and requests."""
    tensors: dict[str, torch.Tensor] = {}
    inputs_hash = hashlib.sha256()
    checked = []
    for step, layer, positions, inputs in _checked_inputs(case):
        tensors[f"s{step}.positions"] = torch.from_numpy(positions.astype(np.int64))
        _hash_inputs(inputs_hash, inputs)
        out, lse = mla_decode_f64(inputs, case.preset.kv_lora_rank, case.preset.sm_scale)
        key = f"s{step}.l{layer}"
        tensors[f"{key}.out_bf16"] = out.to(torch.bfloat16)
        tensors[f"{key}.out_fp32"] = out.to(torch.float32)
        tensors[f"{key}.lse"] = lse.to(torch.float32)
        checked.append([step, layer])
        if progress is not None:
            progress()
    manifest = {
        "schema": SCHEMA,
        "case": case.name,
        **case.spec(),  # preset, scenario, generator, seed
        "scale": {"name": case.scale.name, "slots": case.scale.slots, "num_layers": case.num_layers},
        "reference_precision": "float64",
        "checked": checked,
        "checked_request_ids": case.checked_request_ids().tolist(),
        "inputs_sha256": inputs_hash.hexdigest(),
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "safetensors": safetensors.__version__},
    }
    return GoldenData(tensors, manifest)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_header(path: Path) -> None:
    """Refuse, before it is hashed, an outputs file whose safetensors header does not parse or does not account for
    every byte of the file (tensors of a golden's dtypes, each its shape's bytes, back to back to the end): a huge or
    malformed file is refused at once."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little") if size >= 8 else None
        if length is None or length > min(size - 8, HEADER_LIMIT):
            raise HarnessError(str(path), f"not a safetensors file: its {size} bytes do not hold the header its first 8 announce")
        try:
            header = json.loads(f.read(length), object_pairs_hook=unique_keys)  # a tensor named twice: manifests' rule
        except DuplicateKey as exc:
            raise HarnessError(f"{path}: {exc.args[0]}", "not a safetensors file: its header names this tensor twice") from None
        except (ValueError, RecursionError) as exc:  # a UnicodeDecodeError too; RecursionError: nested too deep
            raise HarnessError(str(path), f"not a safetensors file: its header is not JSON ({exc})") from None
    if isinstance(header, dict):
        header.pop("__metadata__", None)
    tensors = validate(header, dict[str, SafetensorsTensor], path, "safetensors header")
    end = 0
    for name, t in sorted(tensors.items(), key=lambda item: item[1].data_offsets):
        if t.dtype not in ITEM_BYTES:
            raise HarnessError(f"{path}: {name}", f"dtype {t.dtype!r}, expected one a golden stores ({', '.join(ITEM_BYTES)})")
        if t.data_offsets != (end, end + math.prod(t.shape) * ITEM_BYTES[t.dtype]):
            raise HarnessError(f"{path}: {name}", f"data_offsets {list(t.data_offsets)} are not the {t.dtype} {t.shape}'s "
                               f"bytes from offset {end}")
        end = t.data_offsets[1]
    if size != 8 + length + end:
        raise HarnessError(str(path), f"{size} bytes, but its header declares {8 + length + end} (8 + a {length}-byte header + "
                           f"{end} of tensors): truncated, padded or not a golden's")


def _canonical(value) -> str:
    """A JSON value as canonical JSON text: equal only when of one type too (true, 1 and 1.0 differ, as their bytes do)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def manifest_digest(manifest: dict) -> str:
    """sha256 of the canonical JSON of every manifest field but manifest_sha256 itself."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


@contextmanager
def refresh_lock(root: Path | None = None):
    """One refresh (or recovery) at a time per golden folder."""
    from filelock import FileLock, Timeout

    root = _root(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(root / LOCK, timeout=LOCK_TIMEOUT_S):
            yield
    except Timeout:
        raise HarnessError(str(root / LOCK), f"another refresh held the lock for {LOCK_TIMEOUT_S} s") from None


def _golden_file(p: Path) -> bool:
    """A golden file of a case folder, or an obtained file beside them: what a swap may delete."""
    return p.is_file() and (p.name in (MANIFEST, OUTPUTS) or p.name.endswith(".obtained.safetensors"))


def _marked_folder(root: Path, prefix: str) -> Path:
    """A new temporary folder `prefix`* in `root`, marked as a refresh's own (MARK naming it) before anything else."""
    folder = Path(tempfile.mkdtemp(dir=root, prefix=prefix))
    try:
        (folder / MARK).write_text(folder.name + "\n")
    except BaseException:
        shutil.rmtree(folder)
        raise
    return folder


def _marked(folder: Path) -> bool:
    """A folder a refresh made: its MARK, a regular file, names it (a copy under another name is not the refresh's)."""
    return folder.is_dir() and not folder.is_symlink() and _names(folder / MARK, folder.name)


def _names(mark: Path, name: str) -> bool:
    """A mark, a regular file, naming `name`."""
    try:
        return mark.is_file() and not mark.is_symlink() and mark.read_text() == name + "\n"
    except (OSError, ValueError):  # unreadable, or not text
        return False


def _aside(folder: Path) -> Path:
    """Where a deletion moves the mark of a folder it emptied: beside it, named after it (and still naming it)."""
    return folder.parent / (MARK + folder.name)


def _discard(folder: Path, ignore_errors: bool = False) -> None:
    """Delete a folder a refresh marked, its mark last: killed at any point, what remains is still known as a refresh's
    own and the next refresh removes it. shutil.rmtree's order is the directory's, so the mark could go first and the
    remainder be the user's for ever. The emptied folder's mark is renamed beside it before the folder goes: an empty
    folder without its mark is never left, and a mark left beside no folder (or an empty one) is removed."""
    try:
        for p in folder.iterdir():
            if p.name != MARK:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        aside = _aside(folder)
        os.rename(folder / MARK, aside)
        folder.rmdir()
        aside.unlink()
    except OSError:
        if not ignore_errors:
            raise


def _refresh_made(folder: Path) -> bool:
    """A folder holds only what a refresh writes into one (golden files, their temporary files, its mark): a folder of
    a leftover's name holding anything else is the user's and is never deleted."""
    temporary = lambda p: p.is_file() and p.name.startswith((f".{MANIFEST}.tmp-", f".{OUTPUTS}.tmp-"))  # noqa: E731
    return folder.is_dir() and not folder.is_symlink() and all(
        not p.is_symlink() and (_golden_file(p) or temporary(p) or p.name == MARK) for p in folder.iterdir())


def _stranded(case_name: str, root: Path) -> list[Path]:
    """Previous goldens a swap left behind: .<case>.old-*/<case>, alone in its marked folder and holding only golden
    files (an unmarked one, the user's backup say, is never moved)."""
    return sorted(p for p in root.glob(f".{case_name}.old-*/{case_name}") if _refresh_made(p) and _marked(p.parent)
                  and sorted(q.name for q in p.parent.iterdir()) == sorted([MARK, case_name]))


def _half_written(case_name: str, root: Path) -> list[Path]:
    """New goldens a killed refresh left half written: marked .<case>.new-* holding only what a refresh writes."""
    return sorted(p for p in root.glob(f".{case_name}.new-*") if _marked(p) and _refresh_made(p))


def _emptied(case_name: str, root: Path) -> list[Path]:
    """Marked .<case>.old-* folders holding only the mark: a swap killed or failed before its first rename, or one put back."""
    return sorted(p for p in root.glob(f".{case_name}.old-*") if _marked(p) and [q.name for q in p.iterdir()] == [MARK])


def _marks_aside(case_name: str, root: Path) -> list[Path]:
    """Marks a deletion killed after emptying its folder left beside it (`_discard`): the folder is gone, or empty."""
    return sorted(p for kind in ("new", "old") for p in root.glob(f"{MARK}.{case_name}.{kind}-*")
                  if _names(p, p.name[len(MARK):]))


def _emptied_beside(aside: Path) -> Path:
    return aside.parent / aside.name[len(MARK):]


def _empty_folder(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())


def _aside_leftover(aside: Path) -> Path:
    """What a refresh removes of a deletion killed after it moved the mark aside: the emptied folder (with the mark),
    else the mark alone: a folder the user put a file into since is theirs."""
    emptied = _emptied_beside(aside)
    return emptied if _empty_folder(emptied) else aside


def _stray_mark(case_name: str, root: Path) -> list[Path]:
    """The mark a refresh killed after its last rename left in the case folder."""
    mark = case_dir(case_name, root) / MARK
    return [mark] if mark.is_file() and not mark.is_symlink() else []


def _named_like_leftovers(case_name: str, root: Path) -> list[Path]:
    return sorted(p for kind in ("new", "old") for p in root.glob(f".{case_name}.{kind}-*"))


def _put_back(case_name: str, root: Path) -> None:
    """With the case folder missing, rename the previous golden a killed swap left back into place (under
    refresh_lock): nothing is deleted, its emptied folder is left for the next refresh."""
    stranded, folder = _stranded(case_name, root), case_dir(case_name, root)
    if stranded and not os.path.lexists(folder):
        os.replace(stranded[0], folder)


def recover(case_name: str, root: Path | None = None) -> None:
    """For a refresh, under refresh_lock: finish an interrupted swap (put the previous golden back), then remove
    what killed refreshes left, each in a folder marked as a refresh's own: older goldens, half-written or unswapped
    new folders, emptied old ones, what a deletion killed midway left (still marked: `_discard`); and a mark left in
    the case folder."""
    _put_back(case_name, _root(root))
    for old in _stranded(case_name, _root(root)):
        _discard(old.parent, ignore_errors=True)
    for new in _half_written(case_name, _root(root)):
        _discard(new, ignore_errors=True)
    for empty in _emptied(case_name, _root(root)):
        _discard(empty)
    for aside in _marks_aside(case_name, _root(root)):
        if _empty_folder(emptied := _emptied_beside(aside)):  # one the user put a file into since is theirs
            emptied.rmdir()
        aside.unlink()  # last: until the folder is gone, the mark beside it names it
    for mark in _stray_mark(case_name, _root(root)):
        mark.unlink()


def _leftovers(case_name: str, root: Path) -> list[Path]:
    return [*_half_written(case_name, root), *(p.parent for p in _stranded(case_name, root)), *_emptied(case_name, root),
            *map(_aside_leftover, _marks_aside(case_name, root)),
            *_stray_mark(case_name, root)]


def clean_leftovers(case_name: str, root: Path | None = None) -> tuple[list[str], list[str]]:
    """For a refresh: what a killed refresh left of this case, recovered and removed under the lock (not taken when
    nothing was left); and the folders of a leftover's name (.<case>.new-*, .<case>.old-*) left alone: no refresh
    marked them as its own. Their names, each."""
    root = _root(root)
    left = []
    if _leftovers(case_name, root):
        with refresh_lock(root):  # a refresh still running finishes first: its folder is no leftover
            left = _leftovers(case_name, root)
            recover(case_name, root)
    return [p.name for p in left], [p.name for p in _named_like_leftovers(case_name, root)]


def load(case_name: str, root: Path | None = None) -> GoldenData:
    """Load and integrity-check a stored golden; any problem is one HarnessError line."""
    folder = case_dir(case_name, root)
    if not folder.exists() and _stranded(case_name, _root(root)):
        with refresh_lock(root):
            _put_back(case_name, _root(root))
    manifest_path, outputs_path = folder / MANIFEST, folder / OUTPUTS
    if not manifest_path.is_file():
        mine = [p.name for p in _named_like_leftovers(case_name, _root(root))
                if not _marked(p) and not (_empty_folder(p) and _names(_aside(p), p.name))]
        why = (NOT_REGULAR if os.path.lexists(manifest_path)
               else "missing: the case folder is a file, not a folder" if os.path.lexists(folder) and not folder.is_dir()
               else "missing from an existing case folder" if os.path.lexists(folder)
               else "missing, its case folder too" + f" ({', '.join(mine)} left alone: not a refresh's own)" * bool(mine)
               + "; run `python -m harness golden refresh`")
        raise HarnessError(str(manifest_path), f"golden manifest {why}")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise HarnessError(str(manifest_path), "manifest must be a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise HarnessError(f"{manifest_path}: schema", f"expected {SCHEMA!r}, got {manifest.get('schema')!r}; "
                           "run `python -m harness golden refresh --force`")
    if manifest_digest(manifest) != manifest.get("manifest_sha256"):
        raise HarnessError(f"{manifest_path}: manifest_sha256", "does not match the manifest: it was edited or corrupted")
    validate(manifest, GoldenManifest, manifest_path)
    if manifest["case"] != case_name:
        raise HarnessError(f"{manifest_path}: case", f"holds {manifest['case']!r}, not {case_name!r}: case folders swapped?")
    manifest["scenario"] = definition(manifest["scenario"])  # its prose is no identity (a manifest written before says it)
    if not outputs_path.is_file():
        why = NOT_REGULAR if os.path.lexists(outputs_path) else "missing"
        raise HarnessError(str(outputs_path), f"golden outputs {why}")
    _check_header(outputs_path)  # a huge or malformed file is refused before hashing reads all of it
    digest = _sha256_file(outputs_path)
    if digest != manifest["outputs_sha256"]:
        raise HarnessError(
            f"{manifest_path}: outputs_sha256",
            f"does not match {outputs_path.name} (sha256 {digest[:12]}...): the golden was modified or corrupted",
        )
    try:
        tensors = safetensors.torch.load_file(outputs_path)
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise HarnessError(str(outputs_path), f"unreadable safetensors ({exc})") from None
    if not manifest["checked"]:
        raise HarnessError(f"{manifest_path}: checked", "empty: the golden checks nothing")
    named = set()
    for step, layer in manifest["checked"]:
        for name in (f"s{step}.positions", *(f"s{step}.l{layer}.{suffix}" for suffix in ("out_fp32", "out_bf16", "lse"))):
            named.add(name)
            if name not in tensors:
                raise HarnessError(f"{outputs_path}: {name}", "tensor missing")
            dtype, rank = TENSOR_TYPES[name.rsplit(".", 1)[1]]
            if tensors[name].dtype != dtype or tensors[name].dim() != rank:
                raise HarnessError(f"{outputs_path}: {name}", f"{tensors[name].dtype} of rank {tensors[name].dim()}, "
                                   f"expected {dtype} of rank {rank}")
            if dtype.is_floating_point and not torch.isfinite(tensors[name]).all():
                raise HarnessError(f"{outputs_path}: {name}", "holds NaN or infinity: no float64 reference gives that")
    if extra := sorted(set(tensors) - named):
        raise HarnessError(f"{outputs_path}: {extra[0]}", "not a tensor of this golden: no (step, layer) of the manifest's "
                           "checked list stores it")
    return GoldenData(tensors, manifest)


def differences(old: GoldenData, new: GoldenData) -> list[str]:
    """What changed between a stored golden and a recomputed one (empty: equivalent)."""
    changes = []
    for field in [f for f in new.manifest if f not in ("inputs_sha256", "versions")]:  # the case spec (seed too), what is checked
        if _canonical(old.manifest.get(field)) != _canonical(new.manifest.get(field)):
            changes.append(f"{field}: {old.manifest.get(field)!r} -> {new.manifest.get(field)!r}")
    if old.manifest.get("inputs_sha256") != new.manifest["inputs_sha256"]:
        changes.append("inputs_sha256: the generated pool rows or queries changed (generator drift)")
    for name, tensor in new.tensors.items():
        stored = old.tensors.get(name)
        if stored is None or stored.shape != tensor.shape:
            changes.append(f"{name}: missing or reshaped")
        elif name.endswith("positions") or name.endswith("out_bf16"):
            if differ := int((_bits(stored) != _bits(tensor)).sum()):  # bit for bit: -0.0 is not 0.0
                changes.append(f"{name}: {differ} elements differ")
        elif not torch.allclose(stored, tensor, rtol=RECOMPUTE_RTOL, atol=RECOMPUTE_ATOL):
            changes.append(f"{name}: max |diff| {float((stored - tensor).abs().max()):.3g}")
        elif signs := int(((stored == tensor) & (_bits(stored) != _bits(tensor))).sum()):  # equal values, other bits: ±0
            changes.append(f"{name}: {signs} zeros of the other sign")
    return changes


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as integers of its width: compared, -0.0 and 0.0 differ."""
    return t if not t.dtype.is_floating_point else t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


def _builtin(scenario) -> bool:
    return Path(scenario.source).resolve().parent == SCENARIO_DIR.resolve()


def spec_mismatch(gold: GoldenData, case: Case) -> str:
    """'' when the golden was made for this case, else why it is another case: its scale, or the
    definition of a scenario read from the user's own file (a built-in's is case_mismatch's)."""
    m = gold.manifest
    if _canonical(m.get("scale")) != _canonical({"name": case.scale.name, "slots": case.scale.slots, "num_layers": case.num_layers}):
        return f"scale ({m.get('scale')})"
    if _canonical(m.get("scenario")) != _canonical(definition(case.scenario.to_dict())) and not _builtin(case.scenario):
        return "scenario definition"
    return ""


def case_mismatch(gold: GoldenData, case: Case) -> str:
    """'' when the manifest's case spec is the case's (preset with sm_scale, generator, seed, a
    built-in scenario's definition, the inputs' sha256), else the first field that differs: a
    stale or re-signed golden never checks a run."""
    m = gold.manifest
    for field, value in json.loads(json.dumps(case.spec())).items():
        got = m.get(field)
        if _canonical(got) != _canonical(value):  # type-strict: a re-signed 8.0 is not the preset's tp 8
            if isinstance(got, dict) and isinstance(value, dict):
                key = next(k for k in sorted({*got, *value}) if _canonical(got.get(k)) != _canonical(value.get(k)))
                field, got, value = f"{field}.{key}", got.get(key), value.get(key)
            return f"{field} is {got!r}, the case's is {value!r}"
    if m.get("inputs_sha256") != inputs_digest(case):
        return "inputs_sha256 is not the sha256 of the inputs this case generates"
    return ""


def coverage_gap(gold: GoldenData, case: Case) -> str:
    """'' when the golden checks every (step, layer) and request the case selects at the positions
    the schedule gives them, in the shapes of the case's outputs, else what is missing: a disarmed
    or reshaped golden must not pass, nor fail the strategies it checks."""
    schedule = case.schedule()
    want = [[b.step, layer] for b in schedule.steps for layer in case.checked_layers()]
    if [list(k) for k in gold.manifest["checked"]] != want:
        return f"checked {gold.manifest['checked']} != the case's {want}"
    ids = case.checked_request_ids()
    if gold.manifest["checked_request_ids"] != ids.tolist():
        return "checked_request_ids differ from the case's"
    heads, width = case.preset.heads_per_rank, case.preset.kv_lora_rank
    for batch in schedule.steps:
        if not np.array_equal(gold.positions(batch.step), checked_positions(batch, ids)):
            return f"s{batch.step}.positions differ from the schedule's"
        rows = len(gold.positions(batch.step))
        for layer in case.checked_layers():
            for suffix, shape in (("out_fp32", [rows, heads, width]), ("out_bf16", [rows, heads, width]), ("lse", [rows, heads])):
                name = f"s{batch.step}.l{layer}.{suffix}"
                if list(gold.tensors[name].shape) != shape:
                    return f"{name} is shaped {list(gold.tensors[name].shape)}, the case's outputs {shape}"
    return ""


def obtained_path(case_name: str, name: str, root: Path | None = None) -> Path:
    """Where `name` (a strategy of `run`, or OUTPUTS' stem for `golden verify`) leaves what it obtained when it
    misses this golden: beside it, keyed as the golden's outputs (pytest-regressions' obtained file)."""
    return case_dir(case_name, root) / f"{name}.obtained.safetensors"


def write_obtained(case_name: str, name: str, tensors: dict[str, torch.Tensor], root: Path | None = None) -> str:
    """Write the obtained outputs beside the golden (replacing only an earlier obtained file, never through a
    link); returns where, or why not (a read-only golden folder does not fail the run)."""
    path = obtained_path(case_name, name, root)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return f"obtained outputs not written: {path} is not a regular file"
    try:
        write_bytes(path, safetensors.torch.save({k: v.contiguous() for k, v in sorted(tensors.items())}))
    except HarnessError as exc:  # write_bytes' one line for an OSError: the folder is read-only, the disk full
        return f"obtained outputs not written: {exc}"
    return f"obtained outputs: {path}"


def _not_the_goldens(folder: Path) -> list[str]:
    """What in a case folder is neither a golden file nor an obtained file: a swap would delete it."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if not _golden_file(p))


def refuse_a_link(case_name: str, root: Path | None = None) -> None:
    """A refresh neither replaces a case folder that is a link (or a file of the case's name) nor writes through it:
    not its new golden, nor the obtained file of a changed one it refuses (exit 2 naming it)."""
    folder = case_dir(case_name, root)
    try:
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise HarnessError(str(folder), "a link or a file, not a case folder: a refresh neither replaces it nor writes "
                               "through it (put the case folder itself there)")
    except OSError as exc:  # an unsearchable golden folder
        raise HarnessError(str(folder), f"cannot read: {exc.strerror or exc}") from None


def write(data: GoldenData, case_name: str, root: Path | None = None) -> None:
    """Write both files into a fresh folder, then swap folders under the refresh lock: the pair
    is never half updated, and a failed swap puts the previous golden back (a killed one is put
    back by the next load or refresh). A linked case folder, or a file in it that is not the golden's, is refused."""
    root = _root(root)
    folder = case_dir(case_name, root)
    with refresh_lock(root):
        recover(case_name, root)
        refuse_a_link(case_name, root)
        if foreign := _not_the_goldens(folder):
            raise HarnessError(str(folder / foreign[0]), "not the golden's own file: a refresh does not delete it "
                               "(move it out of the case folder)")
        new = _marked_folder(root, f".{case_name}.new-")
        try:
            share_folder(new)
            write_bytes(new / OUTPUTS, safetensors.torch.save({k: v.contiguous() for k, v in sorted(data.tensors.items())}))
            data.manifest["outputs_sha256"] = _sha256_file(new / OUTPUTS)
            data.manifest["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            data.manifest["manifest_sha256"] = manifest_digest(data.manifest)
            write_text(new / MANIFEST, json.dumps(data.manifest, indent=2, sort_keys=True) + "\n")
            if folder.exists():
                old = _marked_folder(root, f".{case_name}.old-")
                os.replace(folder, old / case_name)
                try:
                    os.replace(new, folder)
                except OSError as exc:
                    os.replace(old / case_name, folder)
                    _discard(old)
                    raise HarnessError(str(folder), f"swap failed ({exc.strerror or exc}); the previous golden is kept") from None
                _discard(old)
            else:
                os.replace(new, folder)
            (folder / MARK).unlink()  # only now: until the swap is done, its new golden is known as a refresh's own
        finally:
            if os.path.lexists(new):  # the swap did not take it: a failed refresh leaves nothing
                _discard(new, ignore_errors=True)
