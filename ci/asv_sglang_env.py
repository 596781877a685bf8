"""asv environment plugin "sglang-runner-virtualenv": per-commit environments for a user's SGLang.

Like "runner-virtualenv" (ci/asv_runner_env.py) a commit's environment is a bare venv that sees the
runner's packages through a .pth file; here the project installed per commit is SGLang (the asv
`repo` of `python -m ci.sglang_gate`), so the .pth lists the harness checkout first (the
benchmarks import `harness` from it) and leaves out the SGLang checkout itself. The commit's own
sglang, installed into the venv, comes before every runner directory on sys.path, so an SGLang the
runner also has (an offline bundle, an editable install) never shadows it. Enabled by
`"plugins": [".ci.asv_sglang_env"]` in the configuration ci/sglang_gate.py writes.
"""

import os
from pathlib import Path

from asv import util

from ci.asv_runner_env import RunnerVirtualenv, runner_site_dirs

HARNESS = str(Path(__file__).resolve().parents[1])


def pth_lines(sglang_repo: str) -> list[str]:
    """The harness checkout, then the runner's site directories minus the SGLang checkout."""
    return [HARNESS, *(d for d in runner_site_dirs(sglang_repo) if d != HARNESS)]


class SGLangRunnerVirtualenv(RunnerVirtualenv):
    tool_name = "sglang-runner-virtualenv"

    def __init__(self, conf, python, requirements, tagged_env_vars):
        self._sglang_repo = conf.repo
        super().__init__(conf, python, requirements, tagged_env_vars)

    def _setup(self):
        util.check_call([self._executable, "-m", "venv", "--without-pip", self._path])
        purelib = self.run(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        with open(os.path.join(purelib, "asv_runner_site.pth"), "w") as f:
            f.write("\n".join(pth_lines(self._sglang_repo)) + "\n")
