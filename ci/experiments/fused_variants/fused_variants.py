"""Variants of harness/kernels/fused_mla_cuda.cu (compile-time #defines) timed side by side on the tuner's
production pools, and Nsight Compute's per-instruction profile of one launch (GPU; issue 28).

  python -m ci.experiments.fused_variants time OUT.json [--preset glm5-tp8] [--shapes 32x4096,128x2048]
      [--variant NAME[@SOURCE.cu]:DEF=V,DEF=V ...] [--rounds 5] [--layers N] [--config FIELD=V,FIELD=V]
  python -m ci.experiments.fused_variants profile OUT_DIR [--preset P] [--shapes 32x4096] [--variant ...] [--ncu ncu]
  python -m ci.experiments.fused_variants timeline OUT.json [--preset P] [--shapes ...] [--variant ...] [--config ...]

`time`: per shape, the committed table entry's Config for this GPU (harness.kernels.fused_tuning) as the tuner times it
(a CUDA graph of every layer's attention over its own pool, median replay / layers), each variant in turn,
`--rounds` rounds interleaved (base, v1, v2, base, v1, ...): each variant's per-round ratio to base is
measured side by side; the JSON has every sample, the medians and the ratios' spread. `--config` replaces fields
of the table entry's Config (e.g. grid_merge=1,cluster_merge=0 to time the same variants under another merge);
a variant's lower-case DEF=V items replace Config fields for that variant alone (e.g.
`once:convert_once=1,num_splits=4`), or the call's `new_tokens` (1, as fused_fp8 calls the kernel; a count past
every request's length, e.g. `wait:new_tokens=99999`, loads nothing before the wait), its upper-case ones are #defines.
A variant NAME@SOURCE.cu compiles that file (another commit's kernel, say) in place of the committed one, with its
own partial buffers and arrival words (a kernel of another protocol never shares them).
`timeline`: each variant built with DIAG_CLOCK=1, every CTA's timeline over one replay of the timer's graph
(timeline.py says what is recorded and summarized).
`profile`: for each shape and variant, one launch of layer 0 under `ncu --set full --import-source yes`,
then the report's details and SASS source pages as CSV (stall reasons per instruction).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ci.experiments.fused_variants import timeline
from ci.experiments.tune_fused.tune_fused import capture, page_indices, replay_ms, time_graph
from harness.kernels import fused_mla_cuda
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness.kernels.fused_tuning import default_config, entry_for, load_table
from harness.spec.presets import get_preset, get_scale
from harness.spec.schedule import NEW_TOKENS

BASE = "base"
NVTX_RANGE = "attn"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    defines: dict[str, str]
    source: Path | None = None  # a kernel source in place of the committed one
    config: str = ""  # FIELD=V,... replacing Config fields for this variant (config_fields)


def parse_variant(text: str) -> Variant:
    """NAME[@SOURCE]:DEF=V,field=V -> Variant (upper-case names are #defines, lower-case ones Config fields);
    NAME alone is the unmodified kernel."""
    head, _, defs = text.partition(":")
    name, _, source = head.partition("@")
    items = [d for d in defs.split(",") if d]
    return Variant(name, dict(d.split("=", 1) for d in items if not d[0].islower()), Path(source) if source else None,
                   ",".join(d for d in items if d[0].islower()))


def use_variant(variant: Variant, workdir: Path) -> None:
    """Point fused_mla_cuda at the variant's kernel source (its own or the committed one) with its defines
    prepended, and give it fresh kernel caches (kept per variant, so each compiles once)."""
    src = workdir / f"{variant.name}.cu"
    if not src.exists():
        text = variant.source.read_text() if variant.source else fused_mla_cuda.SOURCE_TEXT
        src.write_text("".join(f"#define {k} {v}\n" for k, v in variant.defines.items()) + text)
    caches = _CACHES.setdefault(variant.name, {})
    for fn in fused_mla_cuda.SOURCE_CACHES:
        if fn not in caches:
            wrapped = getattr(_ORIGINAL[fn], "__wrapped__")

            def with_source(*a, _w=wrapped, _src=src):
                fused_mla_cuda.SOURCE = _src
                return _w(*a)
            caches[fn] = functools.cache(with_source)
        setattr(fused_mla_cuda, fn, caches[fn])
    fused_mla_cuda.SOURCE = src


_ORIGINAL = {fn: getattr(fused_mla_cuda, fn) for fn in fused_mla_cuda.SOURCE_CACHES}
_CACHES: dict[str, dict] = {}
fused_mla_cuda.SOURCE_TEXT = fused_mla_cuda.SOURCE.read_text()


CALL_FIELDS = {"new_tokens": NEW_TOKENS}  # fused_mla_decode's arguments a variant may set, with fused_fp8's values


def config_fields(text: str | None, option: str = "--config") -> dict:
    """FIELD=V,FIELD=V -> {FIELD: V} of Config fields (integers; booleans as 0 / 1); `option` names the text's
    command-line option in the error. CALL_FIELDS items are skipped here (call_fields)."""
    fields = {f.name: f.type for f in dataclasses.fields(Config)}
    out = {}
    for item in filter(None, (text or "").split(",")):
        name, _, value = item.partition("=")
        if name in CALL_FIELDS and value.isdigit():
            continue
        if name not in fields or not value.isdigit():
            raise SystemExit(f"{option} {item!r}: FIELD=INTEGER with FIELD one of {', '.join([*fields, *CALL_FIELDS])}")
        out[name] = bool(int(value)) if fields[name] in ("bool", bool) else int(value)
    return out


def call_fields(text: str | None) -> dict:
    """The CALL_FIELDS of FIELD=V,... (integers), each defaulting to fused_fp8's value."""
    items = dict(item.partition("=")[::2] for item in filter(None, (text or "").split(",")))
    return {name: int(items.get(name, default)) for name, default in CALL_FIELDS.items()}


def problem(preset, layers: int, batch: int, kv_len: int, dev, overrides: dict | None = None):
    """The tuner's case: `layers` production pools of finite e4m3 codes (both signs), the preset's page layout,
    random queries; (step(config), the committed Config for the shape with `overrides` replacing its fields)."""
    slots, page = get_scale("prod").slots, preset.page_size
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    pools = [torch.randint(0, 0x7E, (slots + page, 1, 576), dtype=torch.uint8, device=dev, generator=g)
             | (torch.randint(0, 2, (slots + page, 1, 576), dtype=torch.uint8, device=dev, generator=g) << 7)
             for _ in range(layers)]
    indices = page_indices(batch, kv_len, page, slots, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    heads = preset.heads_per_rank
    qs = [(torch.randn(batch, heads, 512, device=dev, generator=g).to(torch.bfloat16),
           torch.randn(batch, heads, 64, device=dev, generator=g).to(torch.bfloat16)) for _ in pools]
    sm = torch.cuda.get_device_properties(dev).multi_processor_count
    config = dataclasses.replace(entry_for(load_table(), batch, kv_len, heads, torch.cuda.get_device_name(dev)) or default_config(batch, kv_len, heads, sm),
                                 **(overrides or {}))
    parts = {}  # per kernel source (variant) and Config, allocated at its first, eager, step

    def step(cfg=config, new_tokens=NEW_TOKENS):
        key = (fused_mla_cuda.SOURCE, cfg)
        if key not in parts:
            parts[key] = partial_buffers(batch, heads, cfg, 512, dev)
        return [fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, preset.sm_scale, cfg,
                                 partials=parts[key], indices_ready=True, new_tokens=new_tokens)
                for pool, (qn, qp) in zip(pools, qs)]
    return step, config


def cases(args):
    """(the output document's header, an iterator of (shape, layers, step, config) per --shapes item: problem's)."""
    dev = torch.device("cuda")
    preset = get_preset(args.preset)
    layers = args.layers or preset.num_layers
    doc = {"preset": preset.name, "layers": layers, "device": torch.cuda.get_device_name(dev), "shapes": []}

    def each():
        for shape in args.shapes.split(","):
            batch, kv_len = (int(x) for x in shape.split("x"))
            yield (shape, layers, *problem(preset, layers, batch, kv_len, dev, config_fields(args.config)))
    return doc, each()


def time_variants(args, variants, workdir: Path) -> dict:
    doc, each = cases(args)
    for shape, layers, step, config in each:
        configs = {name: dataclasses.replace(config, **config_fields(v.config, f"--variant {name}")) for name, v in variants.items()}
        samples = {name: [] for name in variants}
        outputs = {}  # layer 0's (out, lse) of each variant, against base's
        for r in range(args.rounds):
            for name, variant in variants.items():
                use_variant(variant, workdir)
                run = functools.partial(step, configs[name], **call_fields(variant.config))
                samples[name].append(time_graph(run) * 1e3 / layers)
                if r == 0:
                    outputs[name] = run()[0]
            print(f"{shape} round {r}: " + ", ".join(f"{n} {s[-1]:.2f}" for n, s in samples.items()), flush=True)
        base = samples[BASE]
        rows = {}
        for name, s in samples.items():
            ratios = [a / b for a, b in zip(s, base)]
            o, ref = outputs[name], outputs[BASE]
            diff = (o[0].float() - ref[0].float()).norm() / ref[0].float().norm()
            rows[name] = {"defines": variants[name].defines, "source": str(variants[name].source or ""),
                          "config": configs[name].__dict__, "call": call_fields(variants[name].config), "us": s, "median_us": statistics.median(s),
                          "ratio_to_base": ratios, "ratio_median": statistics.median(ratios),
                          "ratio_min": min(ratios), "ratio_max": max(ratios),
                          "out_norm_rel_to_base": float(diff), "lse_max_abs_to_base": float((o[1] - ref[1]).abs().max())}
            print(f"  {name}: {rows[name]['median_us']:.2f} us/layer, x{rows[name]['ratio_median']:.3f} of base "
                  f"[{min(ratios):.3f}, {max(ratios):.3f}], out vs base {float(diff):.2e}", flush=True)
        doc["shapes"].append({"shape": shape, "config": config.__dict__, "variants": rows})
    return doc


def timelines(args, variants, workdir: Path) -> dict:
    """Per shape and variant: the DIAG_CLOCK build's us/layer (the timer's graph) and its CTAs' timeline summary."""
    doc, each = cases(args)
    heads = get_preset(args.preset).heads_per_rank
    for shape, layers, step, config in each:
        rows = {}
        for name, variant in variants.items():
            cfg = dataclasses.replace(config, **config_fields(variant.config, f"--variant {name}"))
            use_variant(dataclasses.replace(variant, name=f"{name}-clock", defines={**variant.defines, "DIAG_CLOCK": "1"}), workdir)
            run = functools.partial(step, cfg, **call_fields(variant.config))
            graph = capture(run)
            us = replay_ms(graph) * 1e3 / layers  # its replays also warm the graph up for the one read below
            kernel = fused_mla_cuda._kernel(cfg.cuda_instance(heads), torch.cuda.current_device())
            timeline.reset(kernel)
            graph.replay()
            rows[name] = {"config": cfg.__dict__, "defines": variant.defines, "clocked_us_per_layer": us,
                          **timeline.summarize(timeline.read(kernel))}
            print(f"{shape} {name}: {us:.2f} us/layer clocked, layer span {rows[name]['layer_span_us']['median']:.2f} us, "
                  f"period {rows[name]['layer_period_us']['median']:.2f} us, "
                  f"release {rows[name]['layer_release_us']['median']:.2f} us", flush=True)
        doc["shapes"].append({"shape": shape, "variants": rows})
    return doc


def profile_one(args, variants, workdir: Path) -> None:
    """Child of `profile` under ncu: a warm-up launch, then one inside the NVTX range (layer 0 only)."""
    dev = torch.device("cuda")
    variant, = variants.values()
    step, _ = problem(get_preset(args.preset), 1, *(int(x) for x in args.shapes.split("x")), dev)
    use_variant(variant, workdir)
    step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    step()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def profile(args, variants) -> None:
    """Per (shape, variant): the first decode kernel in the range under `ncu --set full`, and its details (every
    section's tables), raw metrics and SASS source page (per-instruction stall samples) as CSV."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        for name, variant in variants.items():
            rep = out / f"{args.preset}-{shape}-{name}"
            spec = (name + (f"@{variant.source}" if variant.source else "")
                    + (":" + ",".join(f"{k}={v}" for k, v in variant.defines.items()) if variant.defines else ""))
            child = [sys.executable, "-m", "ci.experiments.fused_variants", "profile-child", str(out), "--preset",
                     args.preset, "--shapes", shape, "--only", spec]
            subprocess.run([args.ncu, "--set", "full", "--import-source", "yes", "--clock-control", "none", "--nvtx",
                            "--nvtx-include", f"{NVTX_RANGE}/", "-k", "regex:fused_mla_decode", "-c", "1", "-f",
                            "-o", str(rep), *child], check=True)
            for page, extra in (("details", ["--print-details", "all"]), ("raw", []),
                                ("source", ["--print-source", "sass"])):
                with open(f"{rep}-{page}.csv", "w") as f:
                    subprocess.run([args.ncu, "-i", f"{rep}.ncu-rep", "--page", page, "--csv", *extra], stdout=f, check=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m ci.experiments.fused_variants", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("time", "timeline", "profile", "profile-child"))
    ap.add_argument("out")
    ap.add_argument("--preset", default="glm5-tp8")
    ap.add_argument("--shapes", default="32x4096,128x2048")
    ap.add_argument("--variant", action="append", default=[], help="NAME[@SOURCE.cu]:DEF=V,DEF=V (base is always timed)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--config", help="FIELD=V,... replacing fields of the table entry's Config (booleans 0 / 1)")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # profile-child: the one variant it launches
    args = ap.parse_args(argv)
    variants = {v.name: v for v in ([parse_variant(args.only)] if args.only else
                                     [Variant(BASE, {})] + [parse_variant(v) for v in args.variant])}
    for v in variants.values():  # a bad field is refused before any pool is built
        config_fields(v.config, f"--variant {v.name}")
    config_fields(args.config)
    workdir = Path(tempfile.mkdtemp(prefix="fused-variants-"))
    if args.mode in ("time", "timeline"):
        doc = (time_variants if args.mode == "time" else timelines)(args, variants, workdir)
        doc["command"] = "python -m ci.experiments.fused_variants " + " ".join(argv)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    elif args.mode == "profile":
        profile(args, variants)
    else:
        profile_one(args, variants, workdir)
    return 0
