"""Runs `jaxgrpo-train` again and again, each run SIGKILLed at a planned point (tests/train/test_fault_injection.py).

    python tests/support/fault_injection_driver.py PLAN.json RESULTS.jsonl

PLAN.json: {"argv": [...common jaxgrpo-train arguments...], "runs": [{"run_dir", "resume", "kill"}, ...]},
`kill` None (run to the end) or {"site", "call", "point"}:

* site "sample" (`Trainer.generate_tokens`: the trainer's sampling, through the rollout engine), "update" (`Trainer.update`), "save" (`Checkpointer.save`), "track"
  (`Trainer.track`, a stateful kernel's update of its state): the
  process SIGKILLs itself `point` x `SPAN_S[site]` seconds into the `call`-th call of that function
  (from a timer thread, wherever the main thread is then), or at the call's return if it ends sooner;
* site "metrics" (`MetricsWriter._append`, the one write of a metrics line): the `call`-th line is
  written only up to its `point` fraction of bytes, then the process SIGKILLs itself: a torn line.

Each run is a child process forked from this driver after it imported JAX, jaxgrpo, tensorboardX and
matplotlib but before JAX started a backend (no device, no thread pool yet), so runs skip the seconds of
imports; each child then starts its own JAX runtime, trains, and is killed for real. RESULTS.jsonl gets
one line per run: {"index", "returncode", "seconds"} (returncode -9: SIGKILLed).
"""

import json
import os
import signal
import sys
import threading
import time
import traceback

import jax  # noqa: F401  (imported, not started: the children start their own backends)
import matplotlib
import tensorboardX  # noqa: F401  (imports torch: seconds each run would otherwise spend)

import jaxgrpo.data.toy  # noqa: F401
import jaxgrpo.run.checkpoint
import jaxgrpo.run.metrics
import jaxgrpo.tools.cli
import jaxgrpo.train.loop

matplotlib.use("Agg")  # as jaxgrpo.run.metrics.plot_run sets it
import matplotlib.pyplot  # noqa: E402,F401

#: Seconds over which a kill inside a call is spread (about the call's length in these runs).
SPAN_S = {"sample": 1.0, "update": 1.0, "save": 0.3, "track": 0.3}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_inside(owner, name: str, call: int, delay_s: float) -> None:
    """Makes the `call`-th call of owner.name SIGKILL the process `delay_s` into it, or at its return."""
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] != call:
            return original(*args, **kwargs)
        timer = threading.Timer(delay_s, _die)
        timer.daemon = True
        timer.start()
        original(*args, **kwargs)
        _die()

    setattr(owner, name, wrapper)


def _tear_line(call: int, point: float) -> None:
    """The `call`-th metrics line is cut at `point` of its bytes, as a crash during its write would leave it."""
    original = jaxgrpo.run.metrics.MetricsWriter._append
    calls = [0]

    def append(path, line):
        calls[0] += 1
        if calls[0] != call:
            return original(path, line)
        original(path, line[: int(point * len(line))])
        _die()

    jaxgrpo.run.metrics.MetricsWriter._append = staticmethod(append)


def _child(argv: list[str], kill: dict | None) -> int:
    if kill:
        site, call, point = kill["site"], kill["call"], kill["point"]
        if site == "sample":
            _kill_inside(jaxgrpo.train.loop.Trainer, "generate_tokens", call, point * SPAN_S[site])
        elif site == "update":
            _kill_inside(jaxgrpo.train.loop.Trainer, "update", call, point * SPAN_S[site])
        elif site == "track":
            _kill_inside(jaxgrpo.train.loop.Trainer, "track", call, point * SPAN_S[site])
        elif site == "save":
            _kill_inside(jaxgrpo.run.checkpoint.Checkpointer, "save", call, point * SPAN_S[site])
        elif site == "metrics":
            _tear_line(call, point)
        else:
            raise ValueError(f"unknown kill site {site!r}")
    return jaxgrpo.tools.cli.train_main(argv)


def main(plan_path: str, results_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    for index, run in enumerate(plan["runs"]):
        argv = [*plan["argv"], "--run-dir", run["run_dir"], *(["--resume"] if run["resume"] else [])]
        log = f"{results_path}.{index}.log"
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 1
            try:
                code = _child(argv, run["kill"])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        with open(results_path, "a") as f:
            f.write(json.dumps({"index": index, "returncode": returncode,
                                "seconds": round(time.perf_counter() - started, 2)}) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
