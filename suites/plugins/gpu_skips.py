"""pytest plugin: on a GPU runner no gpu test is skipped unless the skip is declared.

On a CPU machine gpu tests skip with their reason (the root conftest.py) and nothing here acts. With
``--gpu-runner`` (gpu-correctness.yml passes it) every skipped ``gpu`` test must match an entry of the
expected-skip declaration (suites/gpu/expected_skips.toml, or ``--gpu-expected-skips FILE``): its node id one of
the entry's patterns, its reason the entry's regular expression, and the compute capability of the GPU its test
process ran on one of the entry's. Any other skip, and any module skipped at collection, fails the session, listed
with its reason: a worker whose GPU is unusable (all its gpu tests skip with "needs a CUDA GPU"), a package the
runner lacks, an arch_policy.toml that no longer names the runner's architecture. Under xdist each worker tags its
skip reports with its GPU's capability; the controller (or the one process) checks them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.datafiles import read_toml
from harness.errors import HarnessError

DECLARATION = Path(__file__).resolve().parents[1] / "gpu" / "expected_skips.toml"
ARCH_ATTR = "mla_gpu_capability"  # set on a gpu test's skip report by the process that ran it
FIELDS = {"tests", "reason", "capabilities", "why"}


@dataclass(frozen=True)
class ExpectedSkip:
    tests: tuple[str, ...]
    reason: str
    capabilities: tuple[str, ...] | None  # None: on every GPU
    why: str

    def matches(self, nodeid: str, reason: str, capability: str | None) -> bool:
        if capability is None or (self.capabilities is not None and capability not in self.capabilities):
            return False
        return any(_pattern(p).fullmatch(nodeid) for p in self.tests) and re.search(self.reason, reason) is not None


@functools.cache
def _pattern(text: str) -> re.Pattern:
    """A node-id pattern: `*` any characters, the rest literal (so `[fa3-*]` needs no escaping)."""
    return re.compile(".*".join(re.escape(part) for part in text.split("*")))


def load(path: Path = DECLARATION) -> list[ExpectedSkip]:
    """The declared expected skips; a malformed entry is a HarnessError naming it."""
    entries = read_toml(path).get("skip")
    if not isinstance(entries, list):
        raise HarnessError(f"{path}: skip", "expected [[skip]] tables")
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}: skip[{i}]"
        if not isinstance(entry, dict) or (unknown := set(entry) - FIELDS):
            raise HarnessError(where, f"unknown keys {sorted(unknown) if isinstance(entry, dict) else entry!r}")
        tests, reason, why = entry.get("tests"), entry.get("reason"), entry.get("why")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t for t in tests):
            raise HarnessError(f"{where}.tests", "must list node-id patterns")
        if not isinstance(reason, str) or not reason:
            raise HarnessError(f"{where}.reason", "must be a regular expression")
        try:
            re.compile(reason)
        except re.error as exc:
            raise HarnessError(f"{where}.reason", f"not a regular expression: {exc}") from None
        if not isinstance(why, str) or not why.strip():
            raise HarnessError(f"{where}.why", "must say why the skip is expected")
        capabilities = entry.get("capabilities")
        if capabilities is not None and (not isinstance(capabilities, list) or not capabilities or not all(
                isinstance(c, str) and re.fullmatch(r"[0-9]+\.[0-9]+", c) for c in capabilities)):
            raise HarnessError(f"{where}.capabilities", f"must list 'major.minor' compute capabilities, got {capabilities!r}")
        out.append(ExpectedSkip(tuple(tests), reason, tuple(capabilities) if capabilities is not None else None, why))
    return out


def expected(declared: list[ExpectedSkip], nodeid: str, reason: str, capability: str | None) -> ExpectedSkip | None:
    """The entry that declares this skip, or None."""
    return next((e for e in declared if e.matches(nodeid, reason, capability)), None)


def device_capability() -> str | None:
    """'major.minor' of the GPU this process's gpu tests use (torch's cuda:0); None without a usable one."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


@functools.cache
def _capability() -> str | None:
    try:
        return device_capability()
    except Exception:  # a GPU that fails here is no usable GPU: its skips are not expected
        return None


def _reason(longrepr) -> str:
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu runner")
    group.addoption("--gpu-runner", action="store_true", default=False,
                    help="this session runs on a GPU runner: a skipped gpu test fails it unless --gpu-expected-skips "
                         "declares the skip (and, with --binding-proof, a worker that ran no gpu test fails it)")
    group.addoption("--gpu-expected-skips", metavar="FILE", default=str(DECLARATION),
                    help="the expected-skip declaration (default: suites/gpu/expected_skips.toml)")


def pytest_configure(config: pytest.Config) -> None:
    """With --gpu-runner: every test process tags its skips, the controller (or the one process) accounts for them."""
    if not config.getoption("gpu_runner", False):
        return
    path = Path(config.getoption("gpu_expected_skips"))
    try:
        declared = load(path)
    except (HarnessError, OSError) as exc:
        raise pytest.UsageError(f"--gpu-runner: {exc}") from None
    config.pluginmanager.register(SkipAccounting(path, declared, controller=not hasattr(config, "workerinput")),
                                  "mla_gpu_skip_accounting")


class SkipAccounting:
    def __init__(self, path: Path, declared: list[ExpectedSkip], controller: bool):
        self.path, self.declared, self.controller = path, declared, controller
        self.skips: list[tuple[str, str, str | None]] = []  # (nodeid, reason, capability) of every skip seen
        self.unexpected: list[tuple[str, str, str | None]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        """The test process: tag a skipped gpu test's report with its GPU's capability (it travels to the controller)."""
        report = yield
        if report.skipped and "gpu" in item.keywords:
            setattr(report, ARCH_ATTR, _capability())
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.controller and report.skipped and "gpu" in report.keywords and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, _reason(report.longrepr), getattr(report, ARCH_ATTR, None)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if self.controller and report.skipped:  # a module skipped at collection: no declaration covers it
            self.skips.append((report.nodeid, _reason(report.longrepr), None))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.controller:
            return
        self.unexpected = sorted(s for s in self.skips if expected(self.declared, *s) is None)
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.controller:
            return
        terminalreporter.section("gpu runner skips")
        terminalreporter.write_line(f"{len(self.skips) - len(self.unexpected)} declared skip(s) ({self.path})")
        if self.unexpected:
            terminalreporter.write_line(f"FAILED: {len(self.unexpected)} gpu test(s) skipped on this GPU runner without a "
                                        f"declared reason (declare one in {self.path}, with its why, only if the skip "
                                        "is expected):", red=True)
        for nodeid, reason, capability in self.unexpected:
            terminalreporter.write_line(f"  {nodeid} [GPU {capability or 'none usable'}]: {reason}", red=True)
