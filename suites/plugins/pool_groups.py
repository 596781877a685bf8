"""pytest plugin: GPU tests that read one case's pool run on one xdist worker, which builds it once.

Every gpu test whose pool is a golden case's (its ``case_name`` parameter, else its module's
``CASE``: a module fixture that prepares one case) gets ``xdist_group("pool-<case>")``. Under
``--dist loadgroup`` each group goes to one worker as a unit, and that worker runs it to the end.
xdist passes groups as an '@group' suffix of node ids, which pytest >= 9.2 silently drops
(pytest-dev/pytest-xdist#1386); so each worker also lists nodeid -> group in a folder the
controller hands it, and the controller's scheduler (`pytest_xdist_make_scheduler`) reads it.
Inside a gpu test, ``harness.api`` prepares cases as `SharedPreparedCase`: a process keeps its
last pool (one: a production pool is ~22 GB) and hands it to the next case with the same bytes
(geometry, seed, device), so a group builds its pool once instead of once per test. Decode
sessions undo their pool writes, as they do between strategies. Without xdist the marks change
nothing; ``-p no:suites.plugins.pool_groups`` turns all of it off.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

import harness.api
from harness.execute.decode import make_step_data
from harness.execute.prepared import POOL_ITEM, PreparedCase
from harness.inputs.memory import MemoryPlan

GROUP_PREFIX = "pool-"
GROUPS_KEY = "mla_harness_pool_groups"  # workerinput: the folder where workers list their groups
_GROUP_DIR = pytest.StashKey[Path]()


def pool_case(item: pytest.Item) -> str | None:
    """The case whose pool a gpu test reads: its ``case_name`` parameter, else its module's CASE."""
    if "gpu" not in item.keywords:
        return None
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case_name") if callspec is not None else None
    return case or getattr(getattr(item, "module", None), "CASE", None)


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        case = pool_case(item)
        if case is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(GROUP_PREFIX + case))


def pytest_configure(config: pytest.Config) -> None:
    """xdist controller of a loadgroup run: the folder its workers list their groups in."""
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        config.stash[_GROUP_DIR] = Path(tempfile.mkdtemp(prefix="mla-harness-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUP_DIR in config.stash:
        shutil.rmtree(config.stash[_GROUP_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    if _GROUP_DIR in node.config.stash:
        node.workerinput[GROUPS_KEY] = str(node.config.stash[_GROUP_DIR])


@pytest.hookimpl(tryfirst=True)  # before xdist sends the controller this worker's collection
def pytest_collection_finish(session: pytest.Session) -> None:
    folder = getattr(session.config, "workerinput", {}).get(GROUPS_KEY)
    if folder:
        groups = {item.nodeid: g for item in session.items if (g := group_of(item)) is not None}
        (Path(folder) / f"{session.config.workerinput['workerid']}.json").write_text(json.dumps(groups))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """loadgroup whose groups come from the workers' lists, not from '@group' node id suffixes."""
    if _GROUP_DIR not in config.stash:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ListedGroupScheduling(LoadGroupScheduling):
        listed: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.listed is None:  # first called once every worker has sent its collection
                self.listed = {k: v for p in sorted(config.stash[_GROUP_DIR].glob("*.json"))
                               for k, v in json.loads(p.read_text()).items()}
            return self.listed.get(nodeid) or super()._split_scope(nodeid)

    return ListedGroupScheduling(config, log)


class SharedPreparedCase(PreparedCase):
    """A PreparedCase that reuses this process's last pool when it would build the same bytes."""

    held: tuple | None = None  # (key, pool) of the last pool built

    def _key(self) -> tuple:
        return self.geometry, self.case.scenario.seed, str(self.device)

    def memory_plan(self, strategies) -> MemoryPlan:
        """Planned before `build`: a held pool this case will not reuse is let go first, so its memory counts as free
        (on an 80 GB H100 the last GLM-5 prod pool, 25.5 GiB, held beside a 67 GiB plan refused 16 prod cases), and
        one it will reuse is not counted twice."""
        plan = super().memory_plan(strategies)
        if SharedPreparedCase.held is not None and SharedPreparedCase.held[0] != self._key():
            SharedPreparedCase.held = None
        elif SharedPreparedCase.held is not None:
            plan = replace(plan, items=tuple((name, 0 if name == POOL_ITEM else b) for name, b in plan.items))
        return plan

    def build(self, progress=None) -> "SharedPreparedCase":
        if self.pool is not None:
            return self
        key = self._key()
        if SharedPreparedCase.held is not None and SharedPreparedCase.held[0] == key:
            self.pool, self.build_s = SharedPreparedCase.held[1], 0.0
            self.data = make_step_data(self.case.preset, self.schedule, self.pool, self.faults)
            return self
        SharedPreparedCase.held = None  # let the last pool go before the next one is built
        super().build(progress)
        SharedPreparedCase.held = (key, self.pool)
        return self


@pytest.fixture(autouse=True)
def _share_pools(request, monkeypatch):
    """gpu tests: cases that harness.api prepares share the process's last pool."""
    if "gpu" in request.keywords:
        monkeypatch.setattr(harness.api, "PreparedCase", SharedPreparedCase)
