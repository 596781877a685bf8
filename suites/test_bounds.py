"""Sizes are bounded and validated: the CPU pool grows in whole pages, an impossible scenario or
repeat count is one line and exit 2, seeds are 32-bit. Planted twins: suites/test_mutations_pins.py."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness import cli
from harness.cli.common import case_from
from harness.errors import HarnessError
from harness.spec import synth
from harness.spec.scenario import MAX_BATCH, MAX_KV_LEN, MAX_SCHEDULE_ROWS, MAX_SEED, MAX_STEPS, builtin_names, load_scenario, parse_scenario
from harness.spec.schedule import compile_schedule
from suites.hang_guard import HANG_GUARD_S

# a one-slot pool: where a bound is missing (a planted twin), the run stops at the schedule's own
# "needs N slots" error instead of attempting the impossible size
TINY = ("--device", "cpu", "--slots", "1")


def _scenario_file(tmp_path, body: str):
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\n{body}\n')
    return path


def _one_error_line(capsys, argv: list[str], *needles: str) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    return err


def test_cpu_pool_grows_in_whole_pages(tmp_path):
    """kv_lens = [100000] on glm5-tp8's 64-token pages needs 1,563 pages: the grown pool holds them
    (it used to grow to 100,000 slots = 1,562 pages and exit 2)."""
    path = _scenario_file(tmp_path, "kv_lens = [100000]")
    args = cli.build_parser().parse_args(["run", "--scenario-file", str(path), "--device", "cpu"])
    case = case_from(args, torch.device("cpu"))
    assert case.scale.slots == 1563 * 64
    schedule = compile_schedule(case.scenario, case.scale.slots, case.preset.page_size)
    assert schedule.steps[0].kv_indices.size == 100_000


def test_cpu_pool_grows_to_an_explicit_layouts_highest_slot(tmp_path, capsys):
    """An explicit layout's prefilled slots decide the pool too: slot 70,000 on 64-token pages grows the default CPU
    pool past its page with a fresh page per request for the new tokens, and the schedule builds (it used to stop
    at "slot 70000 is outside the pool's slots"); a slot no host memory holds is one line naming the file's slots."""
    path = _scenario_file(tmp_path, 'layout = "explicit"\nkv_lens = [3, 2]\nslots = [[9000, 9001], [70000]]\nsteps = 70')
    args = cli.build_parser().parse_args(["run", "--scenario-file", str(path), "--device", "cpu"])
    case = case_from(args, torch.device("cpu"))
    assert case.scale.slots == (70000 // 64 + 2 * 2) * 64
    schedule = compile_schedule(case.scenario, case.scale.slots, case.preset.page_size)
    assert schedule.steps[-1].kv_indices.size == 3 + 2 - 2 + 2 * 70
    path.write_text(path.read_text().replace("70000]", "70000000000]"))
    _one_error_line(capsys, ["run", "--scenario-file", str(path), "--device", "cpu"], f"{path}: slots", "lower explicit slots")


@pytest.mark.parametrize(("body", "field", "bound"), [
    ("kv_lens = [10]\nsteps = 1000000", "steps", f"{MAX_STEPS:,}"),
    (f"batch_size = {MAX_BATCH + 1}\nkv_len = 1", "batch_size", f"{MAX_BATCH:,}"),
    (f"kv_lens = [{MAX_KV_LEN + 1}]", "kv_lens[0]", f"{MAX_KV_LEN:,}"),
    (f"batch_size = 2\nkv_len = {MAX_KV_LEN + 1}", "kv_len", f"{MAX_KV_LEN:,}"),
    (f"kv_lens = [{', '.join(['1'] * (MAX_BATCH + 1))}]", "kv_lens", f"{MAX_BATCH:,}"),
    ("batch_size = 256\nkv_len = 4096\nsteps = 10000", "steps", f"{MAX_SCHEDULE_ROWS:,}"),
    (f"kv_lens = [1]\nseed = {2**32}", "seed", f"{MAX_SEED:,}"),
    (f"kv_lens = [1]\nseed = {2**62}", "seed", f"{MAX_SEED:,}"),
])
def test_impossible_scenarios_are_one_line(tmp_path, capsys, body, field, bound):
    path = _scenario_file(tmp_path, body)
    _one_error_line(capsys, ["run", "--scenario-file", str(path), *TINY], f"{path}: {field}", bound)


def test_the_caps_themselves_are_accepted():
    s = parse_scenario({"name": "s", "batch_size": MAX_BATCH, "kv_len": MAX_SCHEDULE_ROWS // MAX_BATCH, "seed": MAX_SEED}, "x")
    assert (len(s.kv_lens), s.seed) == (MAX_BATCH, MAX_SEED)
    assert parse_scenario({"name": "s", "kv_lens": [MAX_KV_LEN]}, "x").kv_lens == (MAX_KV_LEN,)
    assert parse_scenario({"name": "s", "kv_lens": [10], "steps": MAX_STEPS}, "x").steps == MAX_STEPS  # 5.0e7 rows
    for name in builtin_names():
        load_scenario(name)  # every shipped scenario within the caps


def test_seeds_past_32_bits_do_not_alias_seed_0():
    """synth keys are uint32: 2**32 (and 2**70, which TOML cannot hold) must not give seed 0's bytes."""
    for seed in (2**32, 2**70, -1):
        with pytest.raises(ValueError, match="outside 0"):
            synth.kv_base_key(seed, 0)
    assert synth.kv_base_key(MAX_SEED, 0) != synth.kv_base_key(0, 0)
    with pytest.raises(HarnessError, match="seed: must be <= "):
        parse_scenario({"name": "s", "kv_lens": [1], "seed": 2**70}, "x")


@pytest.mark.parametrize("command", ["run", "tpot"])
@pytest.mark.parametrize("repeats", ["1000000000", "-1"])
def test_repeats_are_bounded(capsys, command, repeats):
    _one_error_line(capsys, [command, "--scenario", "b1-l500", *TINY, "--repeats", repeats], "--repeats")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("kind", ["json", "toml"])
def test_utf16_inputs_are_named_utf16(tmp_path, kind, encoding):
    from harness.datafiles import read_json, read_toml

    path = tmp_path / f"x.{kind}"
    path.write_bytes(('{"a": 1}' if kind == "json" else 'name = "x"').encode(encoding))
    with pytest.raises(HarnessError, match="UTF-16 text") as err:
        (read_json if kind == "json" else read_toml)(path)
    assert err.value.where == str(path)


@pytest.mark.parametrize("command", ["compare", "report"])
def test_an_endless_input_is_one_line_not_a_memory_kill(command):
    """/dev/zero given as a results file was read whole: a MemoryError traceback under a memory
    limit, without one the machine's memory filled. Reading stops past datafiles.MAX_BYTES."""
    root = Path(__file__).resolve().parent.parent
    limit = 1 << 30  # 1 GiB of address space

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    argv = ["compare", "/dev/zero", "/dev/zero"] if command == "compare" else ["report", "/dev/zero"]
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=HANG_GUARD_S, preexec_fn=cap)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: /dev/zero: more than 256 MiB"), proc.stderr


def test_utf8_with_bom_reads_and_binary_is_not_called_utf16(tmp_path):
    from harness.datafiles import read_json

    (tmp_path / "bom.json").write_bytes('{"a": 1}'.encode("utf-8-sig"))
    assert read_json(tmp_path / "bom.json") == {"a": 1}
    (tmp_path / "bin.json").write_bytes(b"\x98\x01\x00\x00\xff\xfe")
    with pytest.raises(HarnessError, match="not UTF-8 text"):
        read_json(tmp_path / "bin.json")


@pytest.mark.parametrize(("us", "why"), [("nan", "> 0"), ("inf", "<= 1000000"), ("-1.0", "> 0"), ("0", "> 0"), ("1e300", "<= 1000000"),
                                         ('"5"', "got `str`"), ("true", "got `bool`")])
def test_allreduce_table_refuses_bad_latencies(tmp_path, capsys, us, why):
    """Issue 25 item 14: `us = nan` / `inf` were accepted, and `us = 1e300` (the spin kernel's cycle count overflows
    on CUDA); the CLI names the file and the point's field."""
    table = tmp_path / "ar.toml"
    table.write_text(f"[[point]]\nbytes = 1024\nus = 9.0\n\n[[point]]\nbytes = 2048\nus = {us}\n")
    _one_error_line(capsys, ["tpot", "--device", "cpu", "--scenario", "b1-l500", "--allreduce-table", str(table)],
                    f"error: {table}: ", "`$.point[1].us`", why)


POINTS = "[[point]]\nbytes = 1024\nus = 9.0\n\n[[point]]\nbytes = 2048\nus = 9.5\n"


@pytest.mark.parametrize(("text", "key"), [(f'sorce = "typo"\n{POINTS}', "sorce"), (f"{POINTS}[[pointt]]\nbytes = 4096\nus = 9.9\n", "pointt"),
                                           (f"{POINTS}latency_us = 3\n", "latency_us")])
def test_allreduce_table_refuses_unknown_keys(tmp_path, capsys, text, key):
    """A misspelt key (`sorce`, `[[pointt]]`) or one a point does not take (`latency_us`) was ignored in silence: one
    line naming it. Twin: the table without it loads."""
    from harness.tpot.allreduce import load_table

    table = tmp_path / "ar.toml"
    table.write_text(text)
    _one_error_line(capsys, ["tpot", "--device", "cpu", "--scenario", "b1-l500", "--allreduce-table", str(table)],
                    f"error: {table}: ", f"unknown field `{key}`")
    table.write_text(POINTS)
    assert load_table(table).micros == (9.0, 9.5)


def test_long_phases_print_progress_lines(monkeypatch):
    """Off a terminal (CI logs) a phase prints a line every LINE_EVERY_S seconds, not only when it ends:
    steps = 10^4 ran 100 s silently."""
    from rich.console import Console

    from harness import progress

    clock = iter(range(0, 10_000, 3))  # each advance 3 s later
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    console = Console(record=True, force_terminal=False, width=200)
    with progress.progress_bar(console, "decode", 10) as advance:
        for _ in range(10):
            advance()
    lines = console.export_text().splitlines()
    assert lines[:2] == ["decode: 4/10 after 12 s", "decode: 8/10 after 24 s"] and lines[2].startswith("decode: 10/10 in ")
    assert len(lines) == 3


def test_layers_are_at_most_the_models(capsys):
    """--layers 10^9 used to end in a memory plan saying "the largest pool that fits has 0 slots"."""
    _one_error_line(capsys, ["run", "--scenario", "b1-l500", *TINY, "--layers", "1000000000"], "--layers", "must be <= 78")
    _one_error_line(capsys, ["run", "--scenario", "b1-l500", *TINY, "--preset", "deepseek-v3-tp8", "--layers", "62"],
                    "--layers", "must be <= 61")


@pytest.mark.parametrize("command", ["run --scenario-file", "compare", "golden cases.toml"])
def test_a_pipe_given_as_a_data_file_is_one_line_not_a_wait(tmp_path, command):
    """A FIFO given as a scenario, results or cases file: opening it waited forever for a writer (the run hung until
    killed). It is now one line and exit 2 before it is opened. Twin: the same name as a regular file is read."""
    root = Path(__file__).resolve().parent.parent
    fifo = tmp_path / ("cases.toml" if command.startswith("golden") else "x.toml")
    os.mkfifo(fifo)
    argv = {"run --scenario-file": ["run", "--scenario-file", str(fifo), "--repeats", "0"],
            "compare": ["compare", str(fifo), str(fifo)],
            "golden cases.toml": ["golden", "verify", "--golden-dir", str(tmp_path)]}[command]
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=HANG_GUARD_S)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"error: {fifo}: a pipe (FIFO), not a file; nothing was read (save it to a file)", proc.stderr
    from harness.datafiles import read_text

    fifo.unlink()
    fifo.write_text("x = 1\n")
    assert read_text(fifo) == "x = 1\n"
