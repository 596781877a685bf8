"""Launch configuration of the fused FP8 MLA decode per (batch, KV length).

`fused_tuning.toml` (written by `python -m ci.experiments.tune_fused` on a GPU) maps a bucket, the nearest powers
of two of the batch size and of the longest request, to the fastest measured Config. An entry with
`heads` (query heads per rank) is for that head count only and wins over the entry without; one with `gpu`
(the GPU's name as torch reports it, apart from case and spacing) is for that GPU only and wins over the entry
without on it (heads first: an entry measured on these heads beats one of another GPU's); a shape with no entry
gets `default_config`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.kernels.fused_mla_decode import BLOCK_H, Config
from harness.spec.gpus import gpu_key

TABLE_FILE = Path(__file__).with_name("fused_tuning.toml")
PROGRAMS_PER_SM = 2
MIN_SPLIT_ROWS = 64
MAX_SPLITS = 64
SMALL_BATCH = 16


def bucket(n: int) -> int:
    """The power of two nearest to n in log scale (1 for n <= 1): 500 -> 512, 4097 -> 4096."""
    return 1 << max(0, round(math.log2(max(1, n))))


def default_config(batch: int, max_len: int, num_heads: int, sm_count: int) -> Config:
    """Splits: as many as fit in one wave of PROGRAMS_PER_SM programs per SM (a second, partial
    wave cost 28% at b32-l4096 on the H200: attn_us 119.6 with 9 splits, 93.4 with 8), none under
    MIN_SPLIT_ROWS rows.
    Tile: the H200 tables' choice, 64 rows and 8 warps with fp16 P.V for small batches."""
    head_blocks = -(-num_heads // BLOCK_H)
    wanted = PROGRAMS_PER_SM * sm_count // max(1, batch * head_blocks)
    splits = max(1, min(wanted, max_len // MIN_SPLIT_ROWS, MAX_SPLITS))
    if batch < SMALL_BATCH:
        return Config(splits, block_n=64, num_warps=8, pv_fp16=True)
    return Config(splits)


KEY_FIELDS = ("batch", "kv_len", "heads", "gpu")  # an entry's key (heads, gpu optional); every other field is a Config field
REQUIRED_FIELDS = ("batch", "kv_len", "num_splits", "block_n", "num_warps", "num_stages")


def entry_key(entry: dict) -> tuple[int | str, ...]:
    """A table entry's key: (batch, kv_len), then heads for an entry of one head count, then gpu_key(gpu) for an
    entry of one GPU."""
    return ((int(entry["batch"]), int(entry["kv_len"])) + ((int(entry["heads"]),) if "heads" in entry else ())
            + ((gpu_key(entry["gpu"]),) if "gpu" in entry else ()))


@functools.cache
def load_table(path: Path = TABLE_FILE) -> dict[tuple[int | str, ...], Config]:
    """{entry_key: Config} from the tuning file."""
    doc = read_toml(path)
    table = {}
    fields = {f.name: f.type for f in dataclasses.fields(Config)}
    for i, entry in enumerate(doc.get("entry", [])):
        where = f"{path.name}: entry[{i}]"
        if not isinstance(entry, dict):
            raise HarnessError(where, "must be a [[entry]] table")
        unknown = sorted(set(entry) - set(fields) - set(KEY_FIELDS))
        if unknown:
            raise HarnessError(f"{where}.{unknown[0]}", f"not a field of an entry (those are {', '.join(KEY_FIELDS + tuple(fields))})")
        for name, value in entry.items():
            want = str if name == "gpu" else bool if fields.get(name) in ("bool", bool) else int
            if type(value) is not want:  # noqa: E721 (True is an int, 1 is not a bool)
                must = {str: "a GPU name", bool: "true or false", int: "an integer"}[want]
                raise HarnessError(f"{where}.{name}", f"must be {must}, got {value!r}")
        missing = [name for name in REQUIRED_FIELDS if name not in entry]
        if missing:
            raise HarnessError(f"{where}.{missing[0]}", f"missing (an entry needs {', '.join(REQUIRED_FIELDS)})")
        key = entry_key(entry)
        try:
            config = Config(**{name: value for name, value in entry.items() if name in fields})
        except ValueError as exc:
            raise HarnessError(where, str(exc)) from None
        if key[:2] != (bucket(key[0]), bucket(key[1])) or config.num_splits < 1 or entry.get("heads", 1) < 1 or entry.get("gpu", "x").strip() == "":
            raise HarnessError(where, "batch and kv_len must be powers of two, num_splits >= 1, heads >= 1, gpu a name")
        if key in table:
            scope = "".join(f", {f} {entry[f]}" for f in KEY_FIELDS[2:] if f in entry)
            raise HarnessError(where, f"a second entry for batch {key[0]}, kv_len {key[1]}{scope}")
        table[key] = config
    return table


def entry_for(table: dict, batch: int, max_len: int, num_heads: int, gpu: str | None = None) -> Config | None:
    """The table's Config for this shape's bucket: the entry for these heads (this GPU's, else any GPU's), else the
    one for any heads (this GPU's, else any GPU's)."""
    key = (bucket(batch), bucket(max_len))
    scopes = [(num_heads, gpu_key(gpu)), (num_heads,), (gpu_key(gpu),), ()] if gpu else [(num_heads,), ()]
    return next((table[k] for k in ((*key, *scope) for scope in scopes) if k in table), None)


def choose(batch: int, max_len: int, num_heads: int, sm_count: int, table=None, cuda_smem: int = 0,
           clusters: bool = True, gpu: str | None = None) -> Config:
    """The table's Config for this shape's bucket on `gpu` (entry_for), else the default heuristic. An entry of the CUDA
    kernel needs `cuda_smem` (the device's shared memory per block; 0 where the kernel cannot run):
    where its ring does not fit, the 2-stage 8-warp ring with the same splits, else the default;
    a cluster merge needs `clusters` (sm_90+), else its splits are merged by their last CTA."""
    table = load_table() if table is None else table
    found = entry_for(table, batch, max_len, num_heads, gpu)
    if found is not None and found.cluster_merge and not clusters:
        found = dataclasses.replace(found, cluster_merge=False)
    if found is not None and found.cuda:
        if not cuda_smem:
            found = None
        elif found.cuda_instance(num_heads).smem > cuda_smem:
            small = dataclasses.replace(found, num_stages=2, num_warps=8, ping_pong=False)
            found = small if small.cuda_instance(num_heads).smem <= cuda_smem else None
    return found if found is not None else default_config(batch, max_len, num_heads, sm_count)
