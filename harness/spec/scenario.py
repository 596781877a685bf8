"""Decode workloads as data: TOML files validated into `Scenario` objects."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.datafiles import read_toml
from harness.envvars import MAX_REPEATS
from harness.errors import HarnessError

SCENARIO_DIR = Path(__file__).parent / "scenarios"
LAYOUTS = ("scattered", "contiguous", "tail", "explicit")
MAX_NAME = 100
NAME_PATTERN = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}")
# Caps on a run's size, stated so an impossible one is one line and exit 2, not hours of work
# or a memory kill: requests per step, decode steps, one request's length, seeds (the generator's
# keys are 32-bit: a larger seed would alias a smaller one's bytes); timing samples: MAX_REPEATS.
MAX_BATCH = 1 << 16
MAX_STEPS = 10_000
MAX_KV_LEN = 1 << 20
MAX_SEED = (1 << 32) - 1
MAX_SCHEDULE_ROWS = 1 << 26  # attended rows summed over the steps: the schedule holds each step's indices (12 B a row)
KNOWN_KEYS = {"name", "description", "seed", "steps", "kv_lens", "batch_size", "kv_len", "layout", "slots", "finish"}
DESCRIPTIVE = ("description",)  # prose: changes no workload, so no case's identity (definition)


@dataclass(frozen=True)
class Finish:
    """Request `request` leaves the batch after step `after_step`; its slots are freed."""

    after_step: int
    request: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    steps: int
    kv_lens: tuple[int, ...]  # attended length of each request at step 0 (includes its new token)
    layout: str
    finish: tuple[Finish, ...] = field(default=())
    slots: tuple[tuple[int, ...], ...] = field(default=())  # layout "explicit": each request's prefilled slots
    source: str = ""
    lens_field: str = field(default="kv_lens", compare=False)  # the file's field(s) that gave kv_lens, for error lines: kv_lens or batch_size + kv_len

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "seed": self.seed,
            "steps": self.steps,
            "kv_lens": list(self.kv_lens),
            "layout": self.layout,
            "finish": [{"after_step": f.after_step, "request": f.request} for f in self.finish],
            "slots": [list(s) for s in self.slots],
        }


def definition(fields: dict) -> dict:
    """A scenario's fields (Scenario.to_dict(), or a golden manifest's record of them) but the DESCRIPTIVE ones: what
    makes its workload, which a case's identity (Case.spec: results files' workload digest, goldens) holds."""
    return {k: v for k, v in fields.items() if k not in DESCRIPTIVE}


def _int(where: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HarnessError(where, f"must be an integer, got {value!r}")
    if value < minimum:
        raise HarnessError(where, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise HarnessError(where, f"must be <= {maximum:,}, got {value:,}")
    return value


def _explicit_slots(data: dict, source: str, layout: str, kv_lens) -> tuple[tuple[int, ...], ...]:
    """Layout "explicit": slots[r] lists request r's kv_len - 1 prefilled slots (new tokens come from the free list)."""
    if layout != "explicit":
        if "slots" in data:
            raise HarnessError(f"{source}: slots", 'only allowed with layout = "explicit"')
        return ()
    lists = data.get("slots")
    if not isinstance(lists, list) or len(lists) != len(kv_lens):
        raise HarnessError(f"{source}: slots", f"must be a list of {len(kv_lens)} slot lists, one per request")
    seen: dict[int, str] = {}
    out = []
    for r, (slot_list, n) in enumerate(zip(lists, kv_lens)):
        where = f"{source}: slots[{r}]"
        if not isinstance(slot_list, list) or len(slot_list) != n - 1:
            raise HarnessError(where, f"must list kv_len - 1 = {n - 1} prefilled slots")
        for i, slot in enumerate(slot_list):
            if isinstance(slot, int) and not isinstance(slot, bool) and slot == 0:
                raise HarnessError(f"{where}[{i}]", "slot 0 is the pool's reserved dummy slot")
            _int(f"{where}[{i}]", slot, 1)
            if slot in seen:
                raise HarnessError(f"{where}[{i}]", f"duplicate slot {slot} (also at {seen[slot]})")
            seen[slot] = f"slots[{r}][{i}]"
        out.append(tuple(slot_list))
    return tuple(out)


def parse_scenario(data: dict, source: str) -> Scenario:
    """Validate a decoded TOML table; every error names `source` and the field."""
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise HarnessError(f"{source}: {unknown[0]}", f"unknown field (known: {', '.join(sorted(KNOWN_KEYS))})")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise HarnessError(f"{source}: name", f"must be 1-{MAX_NAME} of A-Z a-z 0-9 . _ - (it names files), got {str(name)[:40]!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise HarnessError(f"{source}: description", f"must be a string, got {type(description).__name__} {str(description)[:40]}")
    seed = _int(f"{source}: seed", data.get("seed", 0), 0, MAX_SEED)
    steps = _int(f"{source}: steps", data.get("steps", 1), 1, MAX_STEPS)
    if "kv_lens" in data:
        if "batch_size" in data or "kv_len" in data:
            raise HarnessError(f"{source}: kv_lens", "give either kv_lens or batch_size + kv_len, not both")
        if not isinstance(data["kv_lens"], list) or not data["kv_lens"]:
            raise HarnessError(f"{source}: kv_lens", "must be a non-empty list of integers")
        if len(data["kv_lens"]) > MAX_BATCH:
            raise HarnessError(f"{source}: kv_lens", f"at most {MAX_BATCH:,} requests, got {len(data['kv_lens']):,}")
        kv_lens = tuple(_int(f"{source}: kv_lens[{i}]", v, 1, MAX_KV_LEN) for i, v in enumerate(data["kv_lens"]))
    elif "batch_size" in data and "kv_len" in data:
        batch = _int(f"{source}: batch_size", data["batch_size"], 1, MAX_BATCH)
        kv_lens = (_int(f"{source}: kv_len", data["kv_len"], 1, MAX_KV_LEN),) * batch
    else:
        raise HarnessError(f"{source}: kv_lens", "missing: give kv_lens or batch_size + kv_len")
    layout = data.get("layout", "scattered")
    if layout not in LAYOUTS:
        raise HarnessError(f"{source}: layout", f"must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    slots = _explicit_slots(data, source, layout, kv_lens)
    finish = data.get("finish", [])
    if not isinstance(finish, list):
        raise HarnessError(f"{source}: finish", f"must be a list of tables, got {type(finish).__name__} {str(finish)[:40]}")
    finishes = []
    for i, entry in enumerate(finish):
        where = f"{source}: finish[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"after_step", "request"}:
            raise HarnessError(where, "must be a table with exactly after_step and request")
        after = _int(f"{where}.after_step", entry["after_step"], 0)
        if after >= steps - 1:
            raise HarnessError(f"{where}.after_step", f"must be < steps - 1 = {steps - 1} so the freed slots get reused")
        request = _int(f"{where}.request", entry["request"], 0)
        if request >= len(kv_lens):
            raise HarnessError(f"{where}.request", f"no request {request} in a batch of {len(kv_lens)}")
        finishes.append(Finish(after, request))
    if len({f.request for f in finishes}) != len(finishes):
        raise HarnessError(f"{source}: finish", "a request can finish only once")
    if len(finishes) >= len(kv_lens):
        raise HarnessError(f"{source}: finish", "at least one request must stay in the batch")
    rows = steps * sum(kv_lens) + len(kv_lens) * steps * (steps - 1) // 2  # every request attends every step
    if rows > MAX_SCHEDULE_ROWS:
        raise HarnessError(f"{source}: steps", f"{steps:,} steps over kv_lens summing to {sum(kv_lens):,} attend {rows:,} rows in all; "
                           f"at most {MAX_SCHEDULE_ROWS:,} (the schedule holds every step's indices)")
    return Scenario(
        name=name,
        description=description,
        seed=seed,
        steps=steps,
        kv_lens=kv_lens,
        layout=layout,
        finish=tuple(finishes),
        slots=slots,
        source=source,
        lens_field="kv_lens" if "kv_lens" in data else "batch_size + kv_len",
    )


def check_repeats(where: str, repeats: int, minimum: int) -> int:
    """A timing sample count within minimum..MAX_REPEATS."""
    return _int(where, repeats, minimum, MAX_REPEATS)


def load_scenario_file(path: str | Path) -> Scenario:
    return parse_scenario(read_toml(path), str(path))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load_scenario(name: str) -> Scenario:
    """A built-in scenario by name (only the names builtin_names lists: never a path)."""
    path = SCENARIO_DIR / f"{name}.toml"
    if name not in builtin_names():
        hint = "; a scenario file goes to --scenario-file" if any(c in name for c in "/\\.") else ""
        raise HarnessError("--scenario", f"unknown scenario {name!r}; built-in: {', '.join(builtin_names())}{hint}")
    return load_scenario_file(path)
