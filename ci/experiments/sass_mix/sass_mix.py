"""The SASS instruction mix of the fused kernel's tile loop, per kernel instance, without a GPU (issue 28):
NVRTC builds harness/kernels/fused_mla_cuda.cu for the target (harness.kernels.nvrtc), nvdisasm reads the cubin
(the nvidia-cuda-nvdisasm wheel, part of the test extra, or a CUDA toolkit's).

  python -m ci.experiments.sass_mix [--arch 90] [--instance NH,STAGES,WARPS[,pp] ...] [--source K.cu]
      [--define NAME=V ...] [--json OUT]

The tile loop is the loop (a backward branch and its body) that holds the most HMMA: the loop over a split's tiles.
Its counts are static, per warp and tile: each instruction of the body counted once, so the three ways a tile is
loaded (one bulk copy, one per row, cp.async gathers) all count, though a tile takes one. Per opcode (the SASS
mnemonic before its first dot) and in all; registers and spills as ptxas reports them.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import fsio
from harness.errors import HarnessError
from harness.kernels import fused_mla_cuda, nvrtc

_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA(?:\.\S+)?\s+`?\(?(\.L_x_\d+)")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")
DEFAULT_INSTANCES = ("8,2,16,pp", "16,2,16,pp", "8,3,8")  # what the committed table launches on sm_90


@dataclasses.dataclass(frozen=True)
class LoopMix:
    instance: str
    registers: int
    spill_bytes: int
    instructions: int
    opcodes: dict[str, int]  # opcode -> count, most frequent first


def nvdisasm() -> str:
    """The nvdisasm of an installed nvidia-cuda-nvdisasm wheel (nvidia/<name>/bin), else the one on PATH."""
    if found := sorted(nvrtc.wheel_files("*/bin/nvdisasm")):
        return str(found[-1])
    if path := shutil.which("nvdisasm"):
        return path
    raise SystemExit("sass_mix: no nvdisasm: `pip install nvidia-cuda-nvdisasm` (the test extra has it) or a CUDA toolkit")


def opcode(instruction: str) -> str:
    return _PREDICATE.sub("", instruction).split()[0].split(".")[0]


def tile_loop(sass: str) -> list[str]:
    """The instructions of the loop holding the most HMMA (the shortest such loop on a tie); SystemExit when no
    loop holds one."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        if m := _LABEL.match(line.strip()):
            labels[m.group(1)] = len(instructions)
        elif m := _INSTRUCTION.match(line):
            instructions.append(m.group(1))
    mma = [i for i, text in enumerate(instructions) if opcode(text) == "HMMA"]
    loops = [(labels[m.group(1)], i) for i, text in enumerate(instructions)
             if (m := _BRANCH.search(text)) and labels.get(m.group(1), i + 1) <= i]
    held = {loop: sum(loop[0] <= k <= loop[1] for k in mma) for loop in loops}
    if not held or max(held.values()) == 0:
        raise SystemExit("sass_mix: no loop holds an HMMA (a build whose tile math the compiler removed?)")
    start, end = max(held, key=lambda loop: (held[loop], loop[0] - loop[1]))
    return instructions[start:end + 1]


def parse_instance(text: str) -> fused_mla_cuda.Instance:
    """NH,STAGES,WARPS[,pp] -> Instance."""
    parts = text.split(",")
    try:
        return fused_mla_cuda.Instance(*map(int, parts[:3]), pp=parts[3:] == ["pp"])
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"sass_mix: --instance {text!r}: NH,STAGES,WARPS[,pp] of a kernel instance ({exc})") from None


def loop_mix(source: str, instance: fused_mla_cuda.Instance, arch: str) -> LoopMix:
    """Build `instance` of `source` for sm_<arch> and count its tile loop."""
    built = nvrtc.build(source, [instance.name], arch, fused_mla_cuda.OPTIONS, fused_mla_cuda.SOURCE.name, ptxas_info=True)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(built.cubin)
        sass = subprocess.run([nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    body = tile_loop(sass)
    resources = built.resources[built.lowered[instance.name]]
    counts = collections.Counter(map(opcode, body))
    return LoopMix(instance.name, resources.registers, resources.spill_stores + resources.spill_loads, len(body),
                   dict(counts.most_common()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ci.experiments.sass_mix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="90", help="sm_<arch> (90, 89, 120)")
    ap.add_argument("--instance", action="append", help="NH,STAGES,WARPS[,pp] (default: " + " ".join(DEFAULT_INSTANCES) + ")")
    ap.add_argument("--source", type=Path, help="a kernel source in place of harness/kernels/fused_mla_cuda.cu")
    ap.add_argument("--define", action="append", default=[], help="NAME=V prepended as #define NAME V")
    ap.add_argument("--json", type=Path, help="write the counts here (a new file)")
    args = ap.parse_args(argv)
    if args.json is not None:
        try:
            fsio.check_writable(args.json, "--json")
        except HarnessError as exc:
            raise SystemExit(f"sass_mix: {exc}") from None
    source = (args.source or fused_mla_cuda.SOURCE).read_text()
    defines = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in args.define)
    mixes = [loop_mix(defines + source, parse_instance(text), args.arch) for text in args.instance or DEFAULT_INSTANCES]
    for mix in mixes:
        top = ", ".join(f"{name} {n}" for name, n in list(mix.opcodes.items())[:12])
        print(f"{mix.instance} sm_{args.arch}: {mix.instructions} instructions in the tile loop (static) "
              f"({mix.registers} registers, {mix.spill_bytes} spill bytes): {top}")
    if args.json is not None:
        command = " ".join(["python -m ci.experiments.sass_mix", *(argv if argv is not None else sys.argv[1:])])
        fsio.write_text(args.json, json.dumps({"command": command, "arch": args.arch,
                                               "loops": [dataclasses.asdict(m) for m in mixes]}, indent=1) + "\n", "--json")
    return 0
