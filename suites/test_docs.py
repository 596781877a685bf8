"""What the README and the guides tell a user to type or open exists: every relative link and #anchor
resolves, every repository path and `suites/...::test` they name is there, and every `--flag` written
after a `python -m harness ...` / `python -m ci....` command is an option of that command. Each check
has a twin that plants a wrong link, anchor, path or flag and must fail."""

from __future__ import annotations

import argparse
import ast
import glob
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = GUIDES + sorted((ROOT / "docs" / "evidence").rglob("*.md"))
# evidence.md's sections on what left the tree name paths of commit 2e17985 on purpose
HISTORY = ("## Paths named in code comments", "## Left the tree")
TOP = ("harness", "suites", "ci", "golden", "docs", ".ci", ".github")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _prose(text: str) -> str:
    """The text without fenced code blocks (headings and links inside them are not markdown)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    out, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+)$", _prose(text), flags=re.M):
        slug = _slug(heading)
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def bad_links(text: str, where: Path) -> list[str]:
    """Relative markdown links, and `docs/x.md#anchor` written as text, whose file or anchor is missing."""
    targets = [(m.group(1), where.parent) for m in re.finditer(r"\]\(([^)\s]+)\)", _prose(text))
               if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))]
    targets += [(m.group(1), ROOT) for m in re.finditer(r"(?<![\w/.-])(docs/[\w/.-]+\.md#[\w-]+)", text)]
    bad = []
    for target, base in targets:
        path, _, anchor = target.partition("#")
        file = (base / path) if path else where
        if not file.exists():
            bad.append(f"{target}: no file {_rel(file)}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            bad.append(f"{target}: no heading #{anchor} in {_rel(file)}")
    return bad


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def _path_exists(token: str, where: Path) -> bool:
    for candidate in _expand(token):
        base = ROOT / "docs" if candidate.startswith("evidence/") else ROOT
        if glob.glob(str(base / candidate)):
            continue
        module, _, attr = candidate.rpartition(".")  # suites/plugins/cpu_affinity.share_cpus: a module's function
        source = base / f"{module}.py"
        if attr.isidentifier() and source.is_file() and re.search(rf"^(def |class )?{attr}\b", source.read_text(), re.M):
            continue
        return False
    return True


def bad_paths(text: str, where: Path) -> list[str]:
    """Repository paths in code spans (`harness/...`, `evidence/...`, `suites/x.py::test_y`) that do not exist."""
    if where.name == "evidence.md":
        text = text.split(HISTORY[0])[0]
    bad = []
    for span in re.findall(r"`([^`\n]+)`", text):
        if span.startswith("git "):  # `git show 2e17985:docs/h200/...`: a path of an older commit
            continue
        for token in span.split():
            token = token.rstrip(".,:;)")
            path, _, test = token.partition("::")
            if "<" in path or not (path.startswith(tuple(f"{t}/" for t in TOP)) or path.startswith("evidence/")):
                continue
            if not _path_exists(path, where):
                bad.append(token)
            elif test and not re.search(rf"^def {re.escape(test)}\(", (ROOT / path).read_text(), re.M):
                bad.append(f"{token}: no such test")
    return bad


# --- flags ----------------------------------------------------------------------------------------

def commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, [--flag, ...]) for each `python -m harness SUB ...` or `python -m MODULE ...` (harness.*, ci.*;
    `torchrun ... -m MODULE` too)
    in code: fenced blocks line by line (a `#` comment, `&&` and `;` end a command), inline spans whole
    (they may wrap). Flags after a bare `--` belong to the command it hands them to, and are not read."""
    pieces = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        pieces += [line.split(" #")[0] for line in block.splitlines()]
    pieces += re.findall(r"`([^`]+)`", _prose(text))
    found = []
    for piece in pieces:
        for part in re.split(r"&&|;", piece):
            m = re.search(r"(?<![\w-])-m ((?:harness|ci)(?:\.[\w.]+)?)((?:\s+[a-z][\w-]*)?)(.*)", part, flags=re.S)
            if not m:
                continue
            module, sub, rest = m.group(1), m.group(2).strip(), m.group(3)
            rest = re.split(r"\s--(?:\s|$)", rest)[0]
            name = f"{module} {sub}" if module == "harness" and sub else module
            found.append((name, re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)))
    return found


def _harness_options() -> dict[str, set[str]]:
    from harness.cli import build_parser

    parser = build_parser()
    options = {"harness": {o for a in parser._actions for o in a.option_strings}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                options[f"harness {sub}"] = {o for a in subparser._actions for o in a.option_strings}
    return options


def _source_options(module: str) -> set[str] | None:
    """The options a module of the checkout declares: the '-x' arguments of its add_argument calls (a package:
    of all its .py files), else, for a module that reads sys.argv itself, its '--x' string constants; and the
    --x words of its shell scripts. None: no such module."""
    path = ROOT / Path(*module.strip(".").split("."))
    files = [*sorted(path.rglob("*.py")), *sorted(path.rglob("*.sh"))] if path.is_dir() else [path.with_suffix(".py")]
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    declared, constants, words = set(), set(), set()
    for f in files:
        if f.suffix == ".sh":
            words |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", f.read_text()))
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"--[a-z][\w-]*", node.value):
                constants.add(node.value)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                declared |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return {"--help"} | (declared or constants) | words


def bad_flags(text: str, harness_options: dict[str, set[str]]) -> list[str]:
    bad = []
    for command, flags in commands(text):
        if command.startswith("harness ") or command == "harness":
            known = harness_options.get(command)
            if known is None:
                bad.append(f"python -m {command}: no such command")
                continue
            known = known | {"--help"}
        else:
            known = _source_options(command)
            if known is None:
                bad.append(f"python -m {command}: no such module")
                continue
        bad += [f"python -m {command} {flag}" for flag in flags if flag not in known]
    return bad


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^(#{2,6} .+)$", _prose(text), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def table_flags(text: str) -> dict[str, set[str]]:
    """{command: the flags its table names} for each section titled with a command (running.md's
    `python -m harness run`); a table row's flags are in its first column."""
    tables = {}
    for heading, body in _sections(text).items():
        m = re.search(r"`python -m harness (\S+)`", heading)
        if m:
            rows = [line.split(" | ")[0] for line in body.splitlines() if line.startswith("| `-")]
            tables[f"harness {m.group(1)}"] = {f for row in rows for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", row)}
    return tables


def bad_table_flags(text: str, harness_options: dict[str, set[str]]) -> list[str]:
    return [f"{command}: {flag}" for command, flags in table_flags(text).items()
            for flag in sorted(flags - harness_options[command])]


@pytest.fixture(scope="module")
def harness_options():
    return _harness_options()


@pytest.mark.parametrize("doc", LINKED, ids=_rel)
def test_links_and_anchors_resolve(doc):
    assert not bad_links(doc.read_text(), doc)


@pytest.mark.parametrize("doc", GUIDES, ids=_rel)
def test_named_paths_and_tests_exist(doc):
    assert not bad_paths(doc.read_text(), doc)


@pytest.mark.parametrize("doc", GUIDES, ids=_rel)
def test_flags_are_options_of_their_command(doc, harness_options):
    text = doc.read_text()
    assert not bad_flags(text, harness_options) + bad_table_flags(text, harness_options)


def test_running_md_lists_every_flag_of_run(harness_options):
    """The README sends users to running.md for "every flag of `run`": its table names each option."""
    listed = table_flags((ROOT / "docs" / "running.md").read_text())["harness run"]
    assert listed == harness_options["harness run"] - {"-h", "--help"}


def quoted_summary(text: str) -> str:
    """The summary line the README quotes for the quick start's `python -m harness run` on a CPU."""
    return re.search(r"On a CPU its last line reads `(summary: [^`]+)`", text).group(1)


def test_readme_quotes_the_summary_line_run_prints_on_a_cpu():
    from suites.test_cli import harness

    proc = harness("run", "--device", "cpu", "--repeats", "0")  # the default case; timing does not change the line
    printed = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and printed == quoted_summary((ROOT / "README.md").read_text()), printed
    planted = "On a CPU its last line reads `summary: 5 pass, 0 fail, 1 unsupported, 0 error; exit 0`: ..."
    assert quoted_summary(planted) != printed  # twin: a stale quote is caught


def test_the_checks_read_what_the_guides_hold(harness_options):
    """The scans are not vacuous: they see the links, paths and commands the guides are known to hold."""
    readme, running = (ROOT / "README.md").read_text(), (ROOT / "docs" / "running.md").read_text()
    assert ("harness run", []) in commands(readme) and ("ci.asv_gate", ["--factor"]) in commands(readme)
    assert ("ci.sglang_gate", ["--sglang-repo", "--json"]) in commands((ROOT / "docs" / "sglang-patch.md").read_text())
    assert "measured-on-an-h200" in anchors(running) and "python--m-harness-run" in anchors(running)
    rows = [line for line in _sections(running)["## `python -m harness run`"].splitlines() if line.startswith("| `-")]
    assert len(rows) >= 10


def test_negative_controls_a_planted_link_anchor_path_and_flag_fail(harness_options, tmp_path):
    doc = ROOT / "docs" / "planted.md"
    assert bad_links("[a](running.md#no-such-heading) [b](nowhere.md) see docs/gating.md#nope\n", doc) == [
        "running.md#no-such-heading: no heading #no-such-heading in docs/running.md",
        "nowhere.md: no file docs/nowhere.md", "docs/gating.md#nope: no heading #nope in docs/gating.md"]
    assert not bad_links("[a](running.md#scenario-files) [b](../README.md#quick-start)\n", doc)  # twin
    assert bad_paths("`harness/no_such.py`, `evidence/fused/nope.json`, `suites/test_cli.py::test_nope`\n", doc) == [
        "harness/no_such.py", "evidence/fused/nope.json", "suites/test_cli.py::test_nope: no such test"]
    assert not bad_paths("`harness/cli/run.py` `suites/test_cli.py::test_planted_fault_exits_1` "
                         "`evidence/headline/glm5-tp8.prod.{b1-l500,b32-l4096}.json`\n", doc)  # twin
    planted = ("`python -m harness run --scenario b1-l500 --no-such-flag`\n```bash\npython -m harness compare A B "
               "--max-regresion 5%  # typo\npython -m ci.asv_gate A B --factor 1.05 --fator 2\n"
               "python -m ci.sglang_gate --json x.json c -- --scenario b32-l4096\n```\n")
    assert bad_flags(planted, harness_options) == ["python -m harness compare --max-regresion", "python -m ci.asv_gate --fator",
                                                   "python -m harness run --no-such-flag"]
    assert bad_flags("`python -m harness frobnicate`, `python -m ci.no_such_tool --x`\n", harness_options) == [
        "python -m harness frobnicate: no such command", "python -m ci.no_such_tool: no such module"]
    table = "## `python -m harness run`\n\n| flag | meaning |\n|---|---|\n| `--repeats N`, `--repeat N` | x |\n"
    assert bad_table_flags(table, harness_options) == ["harness run: --repeat"]
    assert table_flags(table)["harness run"] != harness_options["harness run"] - {"-h", "--help"}  # --force etc. unlisted


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
