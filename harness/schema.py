"""Declared schemas of the JSON files the harness reads back (results files, golden manifests),
checked with msgspec: types, bounded numbers, required fields. Unknown fields are allowed (newer
writers may add some); everything a reader uses is declared here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from harness.errors import HarnessError

BOUND = 1e300  # numbers are finite and well inside float64: 401-digit integers are rejected
Finite = Annotated[float, msgspec.Meta(ge=-BOUND, le=BOUND)]
NonNegative = Annotated[float, msgspec.Meta(ge=0, le=BOUND)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class ErrorStats(msgspec.Struct):
    max_abs: Annotated[float, msgspec.Meta(ge=0)] | None = None  # inf when outputs were non-finite
    max_rel: Annotated[float, msgspec.Meta(ge=0)] | None = None
    norm_rel: Annotated[float, msgspec.Meta(ge=0)] | None = None
    mismatches: Count | None = None
    total: Count | None = None
    matched_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    nonfinite: Count | None = None


class Detail(msgspec.Struct):
    status: str | None = None
    reason: str | None = None
    stats: ErrorStats | None = None
    unsupported: str | None = None


class ResultRow(msgspec.Struct):
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
    samples: list[Finite] = []
    detail: Detail | None = None


class Environment(msgspec.Struct):
    git_commit: str | None = None
    gpu: str | None = None
    cpu: str | None = None
    capability: str | None = None
    driver: str | None = None
    torch: str | None = None
    flashinfer: str | None = None
    clock_sm: str | None = None
    copy_gbps: NonNegative | None = None


class ResultsFile(msgspec.Struct):
    """What compare and report read (report also requires created, environment and repro)."""

    schema: str
    rows: list[ResultRow]
    created: str | None = None
    environment: Environment | None = None
    repro: str | None = None


class PoolScale(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    slots: Count
    num_layers: Count


class GoldenManifest(msgspec.Struct):
    schema: str
    case: str
    preset: dict
    scale: PoolScale
    scenario: dict
    generator: str
    checked: list[tuple[Count, Count]]
    checked_request_ids: list[Count]
    inputs_sha256: Sha256
    outputs_sha256: Sha256
    manifest_sha256: Sha256


T = TypeVar("T")


def validate(doc, kind: type[T], where: str | Path) -> T:
    """`doc` (decoded JSON) checked against `kind`; a mismatch is one HarnessError naming the field."""
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        raise HarnessError(str(where), f"does not match the {kind.__name__} schema: {exc}") from None
