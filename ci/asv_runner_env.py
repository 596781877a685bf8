"""asv environment plugin "runner-virtualenv": per-commit environments that see the runner's packages.

The project is pure Python, so a commit's environment is a bare venv that installs only the
project (`pip install --no-deps`); CUDA torch, FlashInfer, Triton and asv_runner come from the
interpreter running asv, through a .pth file listing its site directories (and PYTHONPATH
entries outside the checkout, e.g. an unpacked offline bundle). Nothing is fetched. That interpreter's
own environment counts as the runner's also where it lives inside the checkout (ci/setup_gpu_runner.sh's
`.venv`, where asv, asv_runner and FlashInfer are installed); the checkout's sources never do.
Enabled in asv.conf.json by `"plugins": [".ci.asv_runner_env"]`.
"""

import os
import site
import sys
import sysconfig

from asv import util
from asv.plugins.virtualenv import Virtualenv


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def runner_site_dirs(exclude: str) -> list[str]:
    """Site directories and other sys.path entries of this interpreter (PYTHONPATH as asv saw it at
    start-up, e.g. an unpacked offline bundle) and ASV_PYTHONPATH, minus the standard library and
    anything under `exclude` (the checkout: a commit must import its own installed harness, never the
    checkout's sources) but this interpreter's own environment (sys.prefix) when that lies inside it: a
    venv in the checkout holds the runner's packages, not the checkout's sources.

    The user site is added only as this interpreter has it on sys.path (no entry of its own: a GPU job sets
    PYTHONNOUSERSITE=1, so what an earlier job left in ~/.local never reaches a commit's environment)."""
    stdlib = {os.path.realpath(sysconfig.get_path(k)) for k in ("stdlib", "platstdlib")}
    candidates = [
        *site.getsitepackages(),
        *sys.path,
        *os.environ.get("ASV_PYTHONPATH", "").split(os.pathsep),
    ]
    exclude = os.path.realpath(exclude)
    own = [p for p in {os.path.realpath(sys.prefix), os.path.realpath(sys.exec_prefix)} if p != exclude and _under(p, exclude)]
    seen, dirs = set(), []
    for path in candidates:
        real = os.path.realpath(path) if path else ""
        if not real or real in seen or not os.path.isdir(real):
            continue
        if _under(real, exclude) and not any(_under(real, p) for p in own):
            continue
        if any(real == s or (real.startswith(s + os.sep) and "site-packages" not in real) for s in stdlib):
            continue
        seen.add(real)
        dirs.append(real)
    return dirs


class RunnerVirtualenv(Virtualenv):
    tool_name = "runner-virtualenv"

    def _setup(self):
        util.check_call([self._executable, "-m", "venv", "--without-pip", self._path])
        purelib = self.run(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        with open(os.path.join(purelib, "asv_runner_site.pth"), "w") as f:
            f.write("\n".join(runner_site_dirs(os.getcwd())) + "\n")

    def _install_requirements(self):
        """Nothing to install: requirements come from the runner's interpreter."""
