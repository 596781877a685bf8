"""Model shapes: the preset's attention shape (harness/spec/presets.py, declared there only) plus the rest
of the model as data (models.toml, keyed by preset name), and the per-rank sizes derived from them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, get_type_hints

import msgspec

from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.results.schema import BOUND
from harness.spec.presets import ModelPreset, get_preset

MODELS_FILE = Path(__file__).resolve().parent / "models.toml"
BLOCK = 128  # FP8 block-quantization tile (128 x 128 weight blocks, 1 x 128 activation groups)
Size = Annotated[int, msgspec.Meta(ge=1)]


class _FromPreset(property):
    """An attribute of the shape that is its preset's (declared in harness/spec/presets.py only)."""


def _from_preset(attr: str) -> property:
    return _FromPreset(lambda self: getattr(self.preset, attr), doc=f"the preset's {attr}")


@dataclass(frozen=True)
class ModelShape:
    """One model's public config numbers plus the tensor parallelism it is served with: the attention
    shape (heads, tp, KV row) is its preset's, the rest comes from models.toml."""

    name: str
    preset: ModelPreset
    # the fields of models.toml's tables (_Table), their types and bounds checked as declared here
    source: str
    hidden_size: Size
    num_layers: Size
    first_k_dense: Annotated[int, msgspec.Meta(ge=0)]
    q_lora_rank: Size
    v_head_dim: Size
    n_routed_experts: Size
    num_experts_per_tok: Size
    n_shared_experts: Size
    moe_intermediate_size: Size
    intermediate_size: Size
    vocab_size: Size
    n_group: Size
    topk_group: Size
    routed_scaling_factor: Annotated[float, msgspec.Meta(gt=0, le=BOUND)]  # finite (NaN fails gt)
    architecture: str  # the architecture and model_type SGLang serves the checkpoint with (sglang 0.5.23 srt/models)
    model_type: str

    # the preset's attention shape, read through the shape
    num_heads = _from_preset("num_heads_total")
    tp = _from_preset("tp")
    kv_lora_rank = _from_preset("kv_lora_rank")
    qk_nope_head_dim = _from_preset("qk_nope_head_dim")
    qk_rope_head_dim = _from_preset("qk_rope_head_dim")
    heads = _from_preset("heads_per_rank")
    kv_a_width = _from_preset("row_width")

    # per-rank sizes (SGLang's TP layout: FFN intermediates and vocab split by tp)
    @property
    def moe_inter(self) -> int:
        return self.moe_intermediate_size // self.tp

    @property
    def dense_inter(self) -> int:
        return self.intermediate_size // self.tp

    @property
    def vocab(self) -> int:
        return self.vocab_size // self.tp

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense

    def with_layers(self, num_layers: int) -> "ModelShape":
        """The first `num_layers` layers (dense layers first, as in the model)."""
        return replace(self, num_layers=num_layers, first_k_dense=min(self.first_k_dense, num_layers))

    def for_pool(self, num_layers: int, where: str = "--layers", model: str = "the model") -> "ModelShape":
        """The model a pool of `num_layers` layers runs (the case's layers): its first layers. `where` names the
        option that set the pool's layers and `model` this shape, for the error when the model has fewer."""
        if num_layers > self.num_layers:
            raise HarnessError(where, f"{model} has {self.num_layers} layers; the pool can't have more ({num_layers})")
        return self.with_layers(num_layers) if num_layers < self.num_layers else self


Unset, UNSET = msgspec.UnsetType, msgspec.UNSET  # a field the table leaves out
# The types and bounds of a models.toml table's fields: ModelShape's but name and preset (load_shape's). A preset's table
# holds each but num_layers (its preset's), [shrink] any of them and num_layers.
_Table = msgspec.defstruct("_Table", [(name, kind | Unset, UNSET) for name, kind in get_type_hints(ModelShape, include_extras=True).items()
                                      if name not in ("name", "preset")])


def _given(values: dict, where: str) -> dict:
    """The fields of one table, each checked against _Table: a wrong type or bound is one error naming `where`.field."""
    try:
        table = msgspec.convert(values, _Table)
    except msgspec.ValidationError as exc:
        message, _, field = str(exc).rpartition(" - at `$")
        raise HarnessError(f"{where}{field.rstrip('`')}", message) from None
    return {k: v for k, v in msgspec.structs.asdict(table).items() if v is not UNSET}


def _validate(shape: ModelShape, where: str) -> ModelShape:
    rules = (
        (shape.moe_intermediate_size % (shape.tp * BLOCK) == 0, "moe_intermediate_size", f"must divide by tp x {BLOCK}"),
        (shape.intermediate_size % (shape.tp * BLOCK) == 0, "intermediate_size", f"must divide by tp x {BLOCK}"),
        (shape.vocab_size % shape.tp == 0, "vocab_size", "must divide by tp"),
        (shape.hidden_size % BLOCK == 0, "hidden_size", f"must divide by {BLOCK}"),
        (shape.q_lora_rank % BLOCK == 0, "q_lora_rank", f"must divide by {BLOCK}"),
        (shape.first_k_dense <= shape.num_layers, "first_k_dense", "must be <= num_layers"),
        (shape.num_experts_per_tok <= shape.n_routed_experts, "num_experts_per_tok", "must be <= n_routed_experts"),
        (shape.n_routed_experts % shape.n_group == 0, "n_group", "must divide n_routed_experts"),
        (shape.topk_group <= shape.n_group, "topk_group", "must be <= n_group"),
        (shape.num_experts_per_tok <= shape.topk_group * (shape.n_routed_experts // shape.n_group), "num_experts_per_tok", "more than the chosen groups hold"),
    )
    for ok, name, message in rules:
        if not ok:
            raise HarnessError(f"{where}.{name}", message)
    return shape


def load_shape(preset_name: str, shrink: bool = False, path: Path | None = None) -> ModelShape:
    """The shape of `preset_name`: its preset's attention shape and layer count, and the rest from
    models.toml (`path`, default MODELS_FILE); with `shrink`, the [shrink] fields replace the file's
    own (and the layer count). Both tables are checked, with `shrink` or not; each error names its own table."""
    preset = get_preset(preset_name)
    path = MODELS_FILE if path is None else path
    data = read_toml(path)
    entry = data.get(preset_name)
    if not isinstance(entry, dict):
        names = ", ".join(k for k in data if k != "shrink")
        raise HarnessError(str(path), f"no model shape for preset {preset_name!r} (have {names})")
    shrunk = data.get("shrink", {})
    if not isinstance(shrunk, dict):
        raise HarnessError(f"{path}: shrink", "must be a table")
    known = set(_Table.__struct_fields__) - {"num_layers"}
    for where, values, allowed in ((f"[{preset_name}]", entry, known), ("[shrink]", shrunk, known | {"num_layers"})):
        unknown = sorted(set(values) - allowed)
        if unknown:
            declared = unknown[0] == "num_layers" or isinstance(getattr(ModelShape, unknown[0], None), _FromPreset)
            why = f"declared by preset {preset_name!r} in harness/spec/presets.py" if declared else "unknown field"
            raise HarnessError(f"{path}: {where}.{unknown[0]}", why)
    missing = sorted(known - set(entry))
    if missing:
        raise HarnessError(f"{path}: [{preset_name}]", f"missing field(s) {missing}")
    own, small = _given(entry, f"{path}: [{preset_name}]"), _given(shrunk, f"{path}: [shrink]")
    shape = _validate(ModelShape(name=preset_name, preset=preset, num_layers=preset.num_layers, **own), f"{path}: [{preset_name}]")
    shrunk_shape = _validate(replace(shape, **small), f"{path}: [shrink]")
    return shrunk_shape if shrink else shape
