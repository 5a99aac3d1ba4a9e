"""A sandboxed Python tool: a policy's code runs in a child process with limits, and its output comes back.

`run_python(code)` runs `code` in a fresh interpreter (`python -I`: no user site, no environment variables
read) whose working directory is a private temporary directory, removed afterwards, with

* **resource limits** (`setrlimit` in the child before the code starts, which may not raise them): CPU
  seconds (a loop that never ends is killed with SIGXCPU), address space (a 10 GB allocation fails with MemoryError), the size of any file it writes
  (its output goes to a file in its directory, so unbounded printing stops there too), and a wall-clock
  timeout after which its whole process group is killed (a sleep that never ends);
* **a policy on what it may do**, an audit hook (`sys.addaudithook`, PEP 578) installed before the code runs,
  which a hook cannot remove: no process creation (fork, exec, spawn, subprocess, os.system: fork bombs),
  no sockets (no network), no ctypes and no walking the garbage collector's objects (no way around the hook), no
  signals to other processes, no raising its limits, and no file written, created, removed or renamed outside
  its directory.

Its stdout and stderr come back truncated to `Limits.output_chars`. `Result.violation` names what stopped it
("cpu", "memory", "timeout", "forbidden: <event>", "exit <code>") or is None; `PYTHON` is the `Tool` a
`ToolEnvironment` offers (its result text begins "error: <violation>" when one occurred).

An audit hook and resource limits are a sandbox for a policy's mistakes and curiosity during training, not
a boundary against a determined attacker: run untrusted code in a container or a VM.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from typing import NamedTuple

from jaxgrpo.envs.tools import Tool


@dataclasses.dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 1 << 20
    output_chars: int = 2000


class Result(NamedTuple):
    output: str
    violation: str | None

    @property
    def text(self) -> str:
        """What the policy reads: the output, after "error: <violation>" when something stopped the code."""
        return self.output if self.violation is None else f"error: {self.violation}\n{self.output}".rstrip()


# Runs in the child before the policy's code: the audit hook, then the code (compiled as "<tool>").
_PRELUDE = r'''
import os, resource, sys
_cpu, _memory, _file = (int(x) for x in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (_memory, _memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (_file, _file))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_root = os.path.realpath(os.getcwd())
_blocked = frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
            "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "ctypes.dlopen",
            "ctypes.dlsym", "ctypes.cdata", "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
            "resource.prlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"})
_paths = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
          "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"})
_write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _inside(path):
    if isinstance(path, int):
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return real == _root or real.startswith(_root + os.sep)

_modules = frozenset({"_posixsubprocess", "_ctypes", "ctypes"})  # process creation, native calls without events

def _hook(event, args):
    if event == "import" and args and str(args[0]).split(".")[0] in _modules:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event in _blocked:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) >= 3 and args[0] is not None:
        mode, flags = args[1] or "", args[2] or 0
        if (any(c in str(mode) for c in "wax+") or flags & _write) and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the tool's directory is not allowed")
    if event in _paths and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the tool's directory is not allowed")

sys.addaudithook(_hook)
del _hook
with open("code.py") as _f:
    _code = compile(_f.read(), "<tool>", "exec")
del _f
try:
    exec(_code, {"__name__": "__main__"})
except SystemExit:
    raise
except BaseException as _error:  # the policy's traceback: its own frames only
    import traceback
    _frames = [f for f in traceback.extract_tb(_error.__traceback__) if f.filename == "<tool>"]
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(_frames))
                     + "".join(traceback.format_exception_only(type(_error), _error)))
    sys.exit(1)
'''


def run_python(code: str, limits: Limits = Limits()) -> Result:
    """Runs `code` in the sandbox (see the module docstring)."""
    if not isinstance(code, str):
        return Result("", "the code must be a string")
    with tempfile.TemporaryDirectory(prefix="jaxgrpo-tool-") as directory:
        with open(os.path.join(directory, "code.py"), "w") as f:
            f.write(code)
        with open(os.path.join(directory, "prelude.py"), "w") as f:
            f.write(_PRELUDE)
        output_path = os.path.join(directory, "output.txt")
        with open(output_path, "wb") as output:
            command = [sys.executable, "-I", "prelude.py", str(limits.cpu_seconds), str(limits.memory_bytes),
                       str(limits.file_bytes)]
            process = subprocess.Popen(command, cwd=directory, stdin=subprocess.DEVNULL, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
            try:
                code_ = process.wait(timeout=limits.wall_seconds)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code_, timed_out = process.wait(), True
        flooded = os.path.getsize(output_path) >= limits.file_bytes
        with open(output_path, "rb") as f:
            text = f.read(4 * limits.output_chars).decode("utf-8", "replace")
    if len(text) > limits.output_chars:
        text = text[:limits.output_chars] + "\n[output truncated]"
    return Result(text, _violation(code_, timed_out, flooded, text))


def _violation(code: int, timed_out: bool, flooded: bool, text: str) -> str | None:
    if timed_out:
        return "timeout"
    if code == -signal.SIGXCPU or code == -signal.SIGKILL:
        return "cpu"
    if flooded or code == -signal.SIGXFSZ:
        return "output too large"
    if "MemoryError" in text:
        return "memory"
    if "PermissionError: sandbox: " in text:
        return "forbidden: " + text.split("PermissionError: sandbox: ", 1)[1].split("\n", 1)[0]
    return None if code == 0 else f"exit {code}"


PYTHON = Tool("python", 'Runs Python code and returns what it prints. Arguments: {"code": "print(2 ** 10)"}.',
              lambda code: run_python(code).text)
