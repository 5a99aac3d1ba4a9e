"""The README's two commands are what CI runs, and the slow tier it leaves out is documented and non-empty."""

import os
import re
import subprocess
import sys

from tests.support.paths import REPO_ROOT


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", open(os.path.join(REPO_ROOT, "README.md")).read(), re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_verbatim():
    install_and_run, install_and_test = _readme_commands()
    ci = open(os.path.join(REPO_ROOT, ".ci", "run")).read().splitlines()
    assert install_and_test in ci
    assert "jaxgrpo-train experiments/quickstart.py" in install_and_run


def test_the_slow_tier_ci_leaves_out_is_collected_by_its_own_command():
    """CI's command deselects the slow tier (`-m "not slow"`), the README names the command that runs it, and that
    command collects tests (pytest's `-m` makes the two selections complementary)."""
    _, install_and_test = _readme_commands()
    assert '-m "not slow"' in install_and_test
    assert "python -m pytest -q -n 2 --dist loadfile -m slow tests" in open(os.path.join(REPO_ROOT, "README.md")).read()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "tests/train"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/train/") for line in collected)
