"""A case = (preset, scale, scenario): what a golden file holds and a run checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness import CHECKOUT, envvars
from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.fsio import refuse_overwriting_inputs
from harness.inputs.pool import PoolGeometry, geometry_for
from harness.spec import synth
from harness.spec.presets import ModelPreset, Scale, get_preset, get_scale
from harness.spec.scenario import Scenario, definition, load_scenario
from harness.spec.schedule import Schedule, compile_schedule

CHECKOUT_GOLDEN_DIR = CHECKOUT / "golden"
GOLDEN_DIR = Path(os.environ.get("MLA_HARNESS_GOLDEN_DIR", CHECKOUT_GOLDEN_DIR))  # the shipped goldens, for tests
_golden_dir_flag: Path | None = None


def use_golden_dir(path: Path | None) -> None:
    """Set by the CLI's --golden-dir; wins over the environment and the checkout."""
    global _golden_dir_flag
    _golden_dir_flag = path


def golden_dir() -> Path:
    """Where goldens live: --golden-dir, else $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/
    (a source checkout or an editable install; a non-editable install has none)."""
    for where, path in (("--golden-dir", _golden_dir_flag), ("MLA_HARNESS_GOLDEN_DIR", envvars.read("MLA_HARNESS_GOLDEN_DIR"))):
        if path:
            if not Path(path).is_dir():
                raise HarnessError(where, f"{path} is not a directory")
            return Path(path)
    if CHECKOUT_GOLDEN_DIR.is_dir():
        return CHECKOUT_GOLDEN_DIR
    raise HarnessError("golden", f"no golden directory: {CHECKOUT_GOLDEN_DIR} does not exist (an installed, non-editable "
                       "harness ships no goldens); pass --golden-dir or set MLA_HARNESS_GOLDEN_DIR to a checkout's golden/")
def golden_folders() -> list[Path]:
    """The golden folders no output may go into: the configured one and the checkout's."""
    folders = [CHECKOUT_GOLDEN_DIR]
    try:
        folders.append(golden_dir())
    except HarnessError:  # none configured: the commands that read goldens say so themselves
        pass
    return [f for f in dict.fromkeys(folders) if f.is_dir()]


PACKAGE = Path(__file__).resolve().parents[1]  # the harness's own code and data tables: a run reads them all


def refuse_clobbering(outputs, inputs) -> None:
    """Before any work: no output (option, path) may be an input, a golden file, inside a golden
    folder (only `golden refresh` writes there) or inside the harness's own package (its code, its kernel sources
    and data tables), even with --force. Options not given (None) are skipped."""
    folders = golden_folders()
    golden_files = [("the golden file", p) for g in folders for p in (*g.glob("*"), *g.glob("*/*")) if p.is_file()]
    refuse_overwriting_inputs([(flag, path) for flag, path in outputs if path is not None], [*inputs, *golden_files],
                              [*(("the golden folder", g) for g in folders), ("the harness's own code", PACKAGE)])


MAX_CHECKED_LAYERS = 4
MAX_CHECKED_REQUESTS = 8


@dataclass(frozen=True)
class Case:
    preset: ModelPreset
    scale: Scale
    scenario: Scenario

    @property
    def name(self) -> str:
        return f"{self.preset.name}.{self.scale.name}.{self.scenario.name}"

    @property
    def num_layers(self) -> int:
        return self.scale.layers_for(self.preset)

    @property
    def geometry(self) -> PoolGeometry:
        return geometry_for(self.preset, self.scale.slots, self.num_layers)

    def schedule(self) -> Schedule:
        return compile_schedule(self.scenario, self.scale.slots, self.preset.page_size)

    def spec(self) -> dict:
        """What the case's inputs are made from beyond its names: the preset's fields (with sm_scale),
        the input generator's version, the seed and the scenario's definition, its prose left out (golden
        manifests and results files record it)."""
        return {"preset": self.preset.__dict__ | {"sm_scale": self.preset.sm_scale}, "generator": synth.GENERATOR_VERSION,
                "seed": self.scenario.seed, "scenario": definition(self.scenario.to_dict())}

    def checked_layers(self) -> list[int]:
        """All layers when few; else the first, the last and two seeded picks in between."""
        n = self.num_layers
        if n <= MAX_CHECKED_LAYERS:
            return list(range(n))
        picks = {0, n - 1}
        key = synth.chain(self.scenario.seed, 0x4C59)
        while len(picks) < MAX_CHECKED_LAYERS:
            key = synth.fmix32_int(key)
            picks.add(1 + key % (n - 2))
        return sorted(picks)

    def checked_request_ids(self) -> np.ndarray:
        """All requests when few; else the 8 with the smallest seeded hash of their id."""
        ids = np.arange(len(self.scenario.kv_lens), dtype=np.int64)
        if len(ids) <= MAX_CHECKED_REQUESTS:
            return ids
        keys = synth.fmix32(np.uint32(synth.chain(self.scenario.seed, 0x5251)) ^ ids.astype(np.uint32))
        return np.sort(ids[np.argsort(keys, kind="stable")[:MAX_CHECKED_REQUESTS]])


def checked_positions(batch, request_ids: np.ndarray) -> np.ndarray:
    """Positions within a step's batch of the checked requests still in it."""
    return np.nonzero(np.isin(batch.request_ids, request_ids))[0]


def _case_table() -> dict[str, dict]:
    """golden/cases.toml as {case name: entry}."""
    cases_file = golden_dir() / "cases.toml"
    table = read_toml(cases_file)
    if unknown := sorted(set(table) - {"case"}):
        raise HarnessError(f"{cases_file}: {unknown[0]}", "unknown key; the file holds [[case]] tables only")
    cases, fields = table.get("case"), ("preset", "scale", "scenario")
    if not isinstance(cases, list) or not cases or not all(isinstance(c, dict) and set(fields) <= set(c) for c in cases):
        raise HarnessError(f"{cases_file}: case", "must be one or more [[case]] tables with preset, scale and scenario")
    named: dict[str, dict] = {}
    for i, c in enumerate(cases):
        if unknown := sorted(set(c) - set(fields)):
            raise HarnessError(f"{cases_file}: case[{i}].{unknown[0]}", f"unknown key; a case names {', '.join(fields)} only")
        for field in fields:
            if not isinstance(c[field], str):
                raise HarnessError(f"{cases_file}: case[{i}].{field}", f"must be a string, got {c[field]!r}")
        name = f"{c['preset']}.{c['scale']}.{c['scenario']}"
        if name in named:
            raise HarnessError(f"{cases_file}: case[{i}]", f"{name} is listed twice")
        named[name] = c
    return named


def golden_case_names() -> list[str]:
    return list(_case_table())


def load_case(name: str) -> Case:
    """A case by its name '<preset>.<scale>.<scenario>' as listed in golden/cases.toml."""
    entry = _case_table().get(name)
    if entry is None:
        raise HarnessError("--case", f"no golden case {name!r} in {golden_dir() / 'cases.toml'}")
    try:
        return Case(get_preset(entry["preset"]), get_scale(entry["scale"]), load_scenario(entry["scenario"]))
    except HarnessError as exc:  # name the file and the entry's field, not the CLI flag
        field = exc.where.lstrip("-")
        raise HarnessError(f"{golden_dir() / 'cases.toml'}: case {name!r}.{field}", exc.message) from None
