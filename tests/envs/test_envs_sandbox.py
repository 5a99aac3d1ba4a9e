"""The sandboxed Python tool: what a policy's code may not do is stopped within its limits, and counted."""

import dataclasses
import os

import pytest

from jaxgrpo.envs import make_environment
from jaxgrpo.envs.sandbox import Limits, run_python

LIMITS = Limits(cpu_seconds=1, wall_seconds=2.0, memory_bytes=1 << 30, file_bytes=1 << 16, output_chars=300)


def test_code_runs_in_its_own_directory_and_its_output_comes_back():
    result = run_python("open('note.txt', 'w').write('kept')\nimport os\nprint(os.listdir('.'), 2 ** 10)", LIMITS)
    assert result.violation is None and "1024" in result.output and "note.txt" in result.output
    assert result.text == result.output
    error = run_python("1 / 0", LIMITS)
    assert error.violation == "exit 1" and error.text.startswith("error: exit 1")
    assert "ZeroDivisionError" in error.output and "prelude" not in error.output  # the policy's frames only


@pytest.mark.parametrize("name, code, violation", [
    ("write outside", "open({outside!r}, 'w').write('x')", "forbidden: writing"),
    ("remove outside", "import os; os.remove({outside!r})", "forbidden: os.remove outside"),
    ("socket", "import socket; socket.create_connection(('127.0.0.1', 9))", "forbidden: socket"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "forbidden: os.fork"),
    ("subprocess", "import subprocess; subprocess.run(['true'])", "forbidden: importing _posixsubprocess"),
    ("ctypes", "import ctypes", "forbidden: importing ctypes"),
    ("the hook's own sets", "import gc\nfor o in gc.get_objects():\n    o.clear() if isinstance(o, set) else None",
     "forbidden: gc.get_objects"),
    ("raise a limit", "import resource; resource.setrlimit(resource.RLIMIT_CPU, (99, 99))", "forbidden: resource"),
    ("10 GB", "block = bytearray(10 * 1024 ** 3)", "memory"),
    ("loop forever", "while True:\n    pass", "cpu"),
    ("sleep forever", "import time; time.sleep(60)", "timeout"),
    ("print forever", "while True:\n    print('x' * 1000)", "output too large"),
])
def test_what_the_sandbox_stops(tmp_path, name, code, violation):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    # CPU time runs slower than the wall on a loaded machine: the CPU limit's case gets a generous wall.
    limits = dataclasses.replace(LIMITS, wall_seconds=30.0) if violation == "cpu" else LIMITS
    result = run_python(code.format(outside=str(outside)), limits)
    assert result.violation is not None and result.violation.startswith(violation), (name, result)
    assert outside.read_text() == "untouched"
    assert len(result.output) <= LIMITS.output_chars + len("\n[output truncated]")


def test_the_tools_environment_answers_with_the_sandbox_and_counts_its_errors():
    env = make_environment("tools")
    assert "python" in env.reset({"question": "q", "answer": "1024"})[0]["content"]
    step = env.step('<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>')
    assert step.observation == [{"role": "tool", "content": "1024\n"}] and step.info["tool_errors"] == 0
    step = env.step('<tool_call>{"name": "python", "arguments": {"code": "import socket; socket.socket()"}}</tool_call>'
                    '<tool_call>{"name": "python", "arguments": {"source": "x"}}</tool_call>')
    results = step.observation[0]["content"]
    assert step.info["tool_errors"] == 2 and "error: wrong arguments for python" in results
    assert env.step("1024").reward == 1.0
    assert os.path.exists(os.getcwd())  # the run goes on where it was
