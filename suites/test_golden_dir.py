"""Goldens are located explicitly: --golden-dir, then $MLA_HARNESS_GOLDEN_DIR, then the checkout;
without any (a non-editable install) golden commands fail with one clear line, `run` goes live."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console

from harness.errors import HarnessError
from harness.inputs import cases
from harness.inputs.cases import golden_dir, load_case, use_golden_dir


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """Two golden folders, each listing one different case."""
    monkeypatch.delenv("MLA_HARNESS_GOLDEN_DIR", raising=False)
    folders = {}
    for name, scenario in (("flag", "b1-l500"), ("env", "b1-l4096")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "cases.toml").write_text(f'[[case]]\npreset = "glm5-tp8"\nscale = "ci"\nscenario = "{scenario}"\n')
        folders[name] = folder
    yield folders
    use_golden_dir(None)


def test_flag_then_env_then_checkout(tables, monkeypatch):
    assert golden_dir() == cases.CHECKOUT_GOLDEN_DIR
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", str(tables["env"]))
    assert cases.golden_case_names() == ["glm5-tp8.ci.b1-l4096"]
    use_golden_dir(tables["flag"])
    assert cases.golden_case_names() == ["glm5-tp8.ci.b1-l500"]


def test_a_missing_explicit_folder_names_the_flag(tables, tmp_path):
    use_golden_dir(tmp_path / "nope")
    with pytest.raises(HarnessError, match="--golden-dir: .*nope is not a directory"):
        golden_dir()


def test_no_golden_folder_is_a_clear_error_and_run_goes_live(tables, tmp_path, monkeypatch):
    """A non-editable install: the checkout path next to the package does not exist."""
    from harness.api import RunConfig, run

    monkeypatch.setattr(cases, "CHECKOUT_GOLDEN_DIR", tmp_path / "site-packages" / "golden")
    with pytest.raises(HarnessError, match="no golden directory.*--golden-dir or set MLA_HARNESS_GOLDEN_DIR"):
        load_case("glm5-tp8.ci.b1-l500")
    outcome = run(RunConfig(case=_ci_case(), device=torch.device("cpu"), strategies=("native_fp8",), repeats=0), Console(quiet=True))
    assert outcome.results[0].verdict.passed


def test_the_reference_records_the_golden_folder_absolute(tables, tmp_path, monkeypatch):
    """A relative --golden-dir was recorded as given (`../g/...`): the run's repro from another folder (its paths made
    absolute) recorded another reference, and the path named nothing elsewhere. It is recorded absolute, resolved."""
    from harness.api import RunConfig, run

    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    use_golden_dir(Path(os.path.relpath(cases.GOLDEN_DIR, tmp_path / "here")))
    outcome = run(RunConfig(case=_ci_case(), device=torch.device("cpu"), strategies=("stock",), repeats=0), Console(quiet=True))
    assert outcome.reference.startswith(f"{cases.GOLDEN_DIR.resolve() / 'glm5-tp8.ci.b1-l500'} (manifest_sha256 "), outcome.reference


def test_golden_commands_read_the_flag_folder(tmp_path):
    from harness.cli import main

    folder = tmp_path / "g"
    shutil.copytree(cases.GOLDEN_DIR / "glm5-tp8.ci.b1-l500", folder / "glm5-tp8.ci.b1-l500")
    shutil.copy(cases.GOLDEN_DIR / "cases.toml", folder / "cases.toml")
    (folder / "glm5-tp8.ci.b1-l500" / "manifest.json").unlink()  # the checkout's copy is intact: the flag was read
    try:
        assert main(["golden", "verify", "--case", "glm5-tp8.ci.b1-l500", "--golden-dir", str(folder)]) == 2
    finally:
        use_golden_dir(None)


def _ci_case():
    from harness.spec.presets import get_preset, get_scale
    from harness.spec.scenario import load_scenario

    return cases.Case(get_preset("glm5-tp8"), get_scale("ci"), load_scenario("b1-l500"))


@pytest.mark.parametrize("edit, field", [
    ('[[case]]\npreset = "glm5-tp8"\nscale = "ci"\nscenario = "b1-l500"\n', "case[1]"),  # the same case twice
    ('seed = 7\n', "seed"),  # read as the top level's key: TOML puts it before the tables only, so prepend
    ('[[case]]\npreset = "glm5-tp8"\nscale = "ci"\nscenario = "b1-l4096"\nseed = 7\n', "case[1].seed"),
])
def test_cases_toml_refuses_a_duplicate_case_and_unknown_keys(tables, edit, field):
    """A case listed twice, or a key no case reads (a `seed` the user meant to set), was silently ignored. Each is
    now one error naming cases.toml and the entry. Twin: the unedited table reads."""
    use_golden_dir(tables["flag"])
    assert cases.golden_case_names() == ["glm5-tp8.ci.b1-l500"]
    path = tables["flag"] / "cases.toml"
    path.write_text(edit + path.read_text() if field == "seed" else path.read_text() + edit)
    with pytest.raises(HarnessError) as err:
        cases.golden_case_names()
    assert err.value.where == f"{path}: {field}", err.value
