"""What the commands share: lazy help texts (no torch for `--help`), the device and case from the arguments,
and the refusal to write over an input or into a golden folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness import CHECKOUT
from harness.errors import HarnessError

DEFAULT_SCENARIO = "b1-l4096"  # the case `run` and `tpot` measure when no scenario is named
HOST_MEMORY_PER_SLOT = 64  # bytes of host memory the schedule's free list takes per pool slot


class LazyHelp(str):
    """A help text computed only when help is printed (listing names must not import torch)."""

    def __new__(cls, render):
        obj = super().__new__(cls, "(computed)")
        obj.render = render
        return obj


class Formatter(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return action.help.render() if isinstance(action.help, LazyHelp) else action.help


def strategy_names() -> list[str]:
    """The registered strategies in run order, read from the @register(...) calls of their modules
    (importing the registry imports torch, which `--help` must not)."""
    import ast

    found = []
    for path in (CHECKOUT / "harness" / "strategies").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register" and node.args:
                order = next((k.value.value for k in node.keywords if k.arg == "order"), float("inf"))
                found.append((order, node.args[0].value))
    return [name for _, name in sorted(found)]


def strategy_help() -> str:
    return f"run only this strategy (repeatable): {', '.join(strategy_names())}"


def preset_help() -> str:
    from harness.spec.presets import PRESETS

    return f"model preset (default glm5-tp8): {', '.join(PRESETS)}"


def scenario_help() -> str:
    from harness.spec.scenario import builtin_names

    return f"built-in scenario (default {DEFAULT_SCENARIO}): {', '.join(builtin_names())}"


def fault_help() -> str:
    from harness.spec.faults import Fault

    return f"plant a fault (negative control; repeatable): {', '.join(f.value for f in Fault)}"


def device_from(text: str):
    import torch

    if text == "auto":  # resolved as the named device is: `auto` on a GPU is cuda:0, as `cuda` is
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        raise HarnessError("--device", f"not a device: {text!r}") from None
    if device.type == "cpu" and device.index is not None:
        raise HarnessError("--device", f"{text!r}: the CPU takes no index (cpu)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device", "CUDA requested but no CUDA GPU is visible")
    if device.type not in ("cpu", "cuda"):
        raise HarnessError("--device", f"unsupported device type {device.type!r}")
    if device.type == "cuda":
        if (device.index or 0) >= torch.cuda.device_count():
            raise HarnessError("--device", f"{device} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)  # kernels launched without an explicit device go here too
    return device


def add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="glm5-tp8", help=LazyHelp(preset_help))
    p.add_argument("--scale", default=None, help="pool scale: prod (495,552 slots) or ci; default prod on CUDA, ci on CPU")
    p.add_argument("--slots", type=int, default=None, help="override the scale's slot count")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers materialized")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scenario", default=None, help=LazyHelp(scenario_help))
    g.add_argument("--scenario-file", type=Path, default=None, help="a scenario TOML file")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def case_from(args, device, console: Console | None = None, pool: bool = True):
    """The case to run. On the default CPU scale a scenario larger than its pool gets a pool that
    fits (said on the console); the pool (unless `pool` is False: a command that builds none, as export-inputs)
    and the schedule's free list must fit memory before the free list is built."""
    import torch

    from harness.inputs.cases import Case
    from harness.inputs.memory import MemoryPlan
    from harness.spec.presets import get_preset, get_scale
    from harness.spec.scenario import load_scenario, load_scenario_file
    from harness.spec.schedule import least_pool

    scale_name = args.scale if args.scale is not None else ("prod" if device.type == "cuda" else "ci")  # '' is no scale
    scenario = load_scenario_file(args.scenario_file) if args.scenario_file else load_scenario(DEFAULT_SCENARIO if args.scenario is None else args.scenario)
    preset, scale = get_preset(args.preset), get_scale(scale_name, args.slots, args.layers)
    if args.layers is None and scale.layers_for(preset) > preset.num_layers:  # a model of fewer layers than the scale's: all of them
        scale = get_scale(scale_name, args.slots, preset.num_layers)
    if scale.layers_for(preset) > preset.num_layers:
        raise HarnessError("--layers", f"must be <= {preset.num_layers} ({preset.name}'s layers), got {scale.layers_for(preset):,}")
    needed = least_pool(scenario, preset.page_size)
    need = needed[1]
    if need > scale.slots and args.scale is None and args.slots is None and device.type == "cpu":
        scale = get_scale(scale_name, need, scale.num_layers)
        if console is not None:
            console.print(f"{scenario.name} needs {need:,} slots: the {scale_name} pool grows to {need:,} (--slots {need})", style="yellow",
                          markup=False)
    case = Case(preset, scale, scenario)
    row_bytes = case.num_layers * preset.row_width
    host_pool = device.type == "cpu" and pool  # a CPU pool lives in host memory beside the free list
    host_per_slot = row_bytes * host_pool + HOST_MEMORY_PER_SLOT
    what = "pool and free list in host memory" if host_pool else "free list in host memory"
    MemoryPlan(((what, host_per_slot * scale.slots),), host_per_slot, scale.slots).check(torch.device("cpu"), needed=needed)
    if pool:
        MemoryPlan((("fp8 pool", row_bytes * scale.slots),), row_bytes, scale.slots).check(device, needed=needed)
    return case


def inputs_of(case) -> list[tuple[str, Path]]:
    """The scenario file (the harness's own data tables and code are protected by refuse_clobbering)."""
    return [("the scenario file", Path(case.scenario.source))] if case.scenario.source else []

