"""Every error a user can cause is one line from every console script.

A corpus of bad inputs (missing and corrupt files, bad `--set` values, unknown names, impossible topologies and
budgets, run directories in use or holding another run, damaged run directories, bad command lines) runs through
each `*_main(argv)` in this process. Each must exit with 1 or 2 (the status its kind of error promises), write
exactly one line to stderr, `jaxgrpo-<tool>: error: ...`, naming the problem, with no traceback, and leave the run
directory unlocked. Cases that need a model use the toy model and fail before training. Two cases run as child
processes, as a user runs them: Ctrl-C during compilation (one line, exit 130, no crash) and an error raised after
the model is built (nothing else on stderr).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest

from jaxgrpo.config import apply_overrides, load_experiment, to_dict
from jaxgrpo.tools import cli
from tests.support import processes
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOY = os.path.join(ROOT, "experiments", "toy_sum.py")
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k")
# The toy run, as small as it gets on the tests' 8 CPU devices (a micro-batch of 8 rows splits over their 8 data
# shards); cases that reach the trainer fail before its first step.
SMALL = ["steps=1", "warmup_sft_steps=0", "eval_every=0", "task.num_eval_examples=0", "prompts_per_step=4",
         "group_size=2", "sampling.max_new_tokens=2"]


class Files:
    """Where a case builds its inputs (a tmp directory)."""

    def __init__(self, root):
        self.root = root

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def write(self, name: str, text: str) -> str:
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_dir(self, name: str = "run", *, config: dict | str | None = None, checkpoints=(), metrics=None) -> str:
        """A run directory as a run leaves it: config.json (a dict, or raw text), checkpoint steps, metrics lines."""
        path = self.path(name)
        os.makedirs(path, exist_ok=True)
        if config is not None:
            self.write(f"{name}/config.json", config if isinstance(config, str) else json.dumps(config))
        for step in checkpoints:
            os.makedirs(os.path.join(path, "checkpoints", str(step)), exist_ok=True)
        if metrics is not None:
            self.write(f"{name}/metrics.jsonl", "".join(line + "\n" for line in metrics))
        return path

    def toy_config(self, *overrides, run_dir=None) -> dict:
        cfg = load_experiment(TOY)
        apply_overrides(cfg, [*SMALL, *overrides])
        cfg.run_dir = run_dir or self.path("run")
        return to_dict(cfg)

    def gsm8k_copy(self, name: str, train: str) -> str:
        """A GSM8K data directory whose train.jsonl is `train` (test.jsonl: one good example)."""
        self.write(f"{name}/train.jsonl", train)
        self.write(f"{name}/test.jsonl", json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
        return self.path(name)

    def hf_model(self, max_positions: int) -> str:
        """A model directory's config.json (no weights: what is checked before they are read)."""
        return os.path.dirname(self.write("model/config.json", json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "hidden_act": "silu", "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": True})))

    def study(self, body: str = "", *, experiment: str = TOY, grid: str = "{}") -> str:
        return self.write("tiny_study.py", f"""
from jaxgrpo.evaluation.study import Study


def study():
    {body}
    return Study(name="tiny", experiment={experiment!r}, claim="c", metrics=["accuracy"], seeds=[0, 1],
                 methods={{"grpo": {{}}}}, grid={grid}, overrides={{"steps": 1}})
""")


@dataclasses.dataclass(frozen=True)
class Case:
    tool: str
    argv: Callable[[Files], list[str]]
    status: int
    needle: str  # in the error line: the problem named
    #: A run directory (relative to the case's tmp directory) whose lock must be free afterwards.
    run_dir: str | None = "run"


def train(*extra, status=2, needle="", run_dir="run"):
    return Case("train", lambda f: [TOY, "--run-dir", f.path("run"), "--set", *SMALL, *extra], status, needle, run_dir)


CASES = {
    # -- jaxgrpo-train: the command line and the experiment file
    "train: no experiment": Case("train", lambda f: [], 2, "the following arguments are required: experiment"),
    "train: unknown flag": Case("train", lambda f: [TOY, "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
    "train: missing experiment file": Case("train", lambda f: [f.path("nope.py")], 2, "nope.py' not found"),
    "train: experiment with a syntax error": Case(
        "train", lambda f: [f.write("bad.py", "def config(:\n")], 2, "bad.py line 1"),
    "train: experiment without config()": Case(
        "train", lambda f: [f.write("noconfig.py", "x = 1\n")], 2, "must define a function config()"),
    "train: config() returns no Config": Case(
        "train", lambda f: [f.write("dict.py", "def config():\n    return {}\n")], 2,
        "must return a jaxgrpo.config.Config, got dict"),
    "train: experiment raising": Case(
        "train", lambda f: [f.write("raises.py", "def config():\n    return {}['x']\n")], 2, "raises.py line 2: KeyError"),
    # -- bad --set values
    "train: --set without =": train("group_size"),
    "train: unknown key": train("group_sise=4", needle="unknown config key 'group_sise'"),
    "train: a section as a key": train("sampling=3", needle="config key 'sampling' is a section"),
    "train: not an int": train("group_size=four", needle="bad value for group_size: expected int, got 'four'"),
    "train: not a bool": train("packing=maybe", needle="bad value for packing: expected a boolean"),
    "train: negative learning rate": train("optimizer.lr=-1e-3", needle="optimizer.lr must be > 0"),
    "train: seed out of range": train("seed=-1", needle="seed must be in [0, 2**32)"),
    "train: huge seed": train("seed=99999999999999999999", needle="seed must be in [0, 2**32)"),
    "train: micro-batch not dividing": train("micro_batch_size=3", needle="not divisible by micro_batch_size=3"),
    "train: --profile past the run": train("--profile", "1", needle="--profile 1 needs a number of steps >= 0 that "
                                                               "leaves the run's first step (which compiles) untraced"),
    "train: negative --profile": train("--profile", "-1", needle="--profile -1 needs a number of steps >= 0"),
    # -- kernels and their keyword arguments
    "train: unknown advantage": train("advantage=grpoo", needle="advantage='grpoo' is not a registered advantage"),
    "train: kernel of another kind": train("loss=grpo", needle="loss='grpo' is an advantage kernel"),
    "train: unknown kernel kwarg": train("loss_kwargs.eps_lo=0.1", needle="loss_kwargs key 'eps_lo' is not an argument"),
    "train: negative clip epsilon": train("loss_kwargs.eps_low=-0.2",
                                          needle="loss_kwargs.eps_low=-0.2 is out of range for ppo_clip: must be >= 0"),
    "train: clip epsilon not a number": train("loss_kwargs.eps_high=abc",
                                              needle="loss_kwargs.eps_high='abc' has the wrong type for ppo_clip"),
    "train: std_ddof >= group size": train("advantage_kwargs.std_ddof=2",
                                           needle="std_ddof=2 is out of range for grpo: must be in [0, group_size=2)"),
    "train: unknown aggregation": train("aggregation=token_avg", needle="aggregation='token_avg' is not an aggregation"),
    # -- what the config names: task, rewards, model, budgets, devices
    "train: unknown task": train("task.name=nosuchtask", needle="task.name='nosuchtask': unknown task"),
    "train: bad task option": train("task.kwargs={'bogus': 1}", needle="do not fit task 'toy_sum'"),
    "train: unknown reward": train("rewards={'nope_reward': 1.0}", needle="unknown reward 'nope_reward'"),
    "train: reward weight not a number": train("rewards={'first_char_reward': 'x'}", needle="must be a finite number"),
    "train: unknown correctness reward": train("correctness_reward=nope",
                                               needle="correctness_reward='nope' is not among the rewards"),
    "train: unknown model": train("model=no-such-model", needle="model='no-such-model': 'no-such-model' is neither"),
    "train: model directory without config": Case(
        "train", lambda f: [TOY, "--run-dir", f.path("run"), "--set", *SMALL, f"model={f.write('m/x', '') and f.path('m')}"],
        2, "config.json is missing"),
    "train: completions past the context window": Case(
        "train", lambda f: [TOY, "--run-dir", f.path("run"), "--set", *SMALL, f"model={f.hf_model(256)}",
                            "sampling.max_prompt_len=200", "sampling.max_new_tokens=100"], 2,
        "sampling.max_prompt_len=200 + sampling.max_new_tokens=100 = 300 positions exceed the context window"),
    "train: mesh not fitting the devices": train("mesh.data=3", needle="mesh (data, fsdp, model) = (3, 1, 1) does not fit"),
    "train: two mesh axes -1": train("mesh.data=-1", "mesh.fsdp=-1", needle="at most one mesh axis may be -1"),
    "train: micro-batch rows fewer than the data shards": train(
        "prompts_per_step=2", needle="micro-batch of 4 sequences cannot be split over the mesh's 8 data x fsdp shards"),
    "train: a field the task does not provide": train("advantage=stratified_grpo", "advantage_kwargs.num_strata=2",
                                                      status=1, needle="needs strata_ids"),
    # -- data
    "train: missing GSM8K directory": train("task.name=gsm8k", "task.kwargs={}", "task.data_dir=/nonexistent/gsm8k",
                                            "correctness_reward=correctness_reward", status=1,
                                            needle="GSM8K data directory /nonexistent/gsm8k does not exist"),
    "train: empty GSM8K file": Case(
        "train", lambda f: [TOY, "--run-dir", f.path("run"), "--set", *SMALL, "task.name=gsm8k", "task.kwargs={}",
                            f"task.data_dir={f.gsm8k_copy('empty', '')}", "correctness_reward=correctness_reward"],
        1, "train.jsonl:1: holds no GSM8K example"),
    "train: malformed GSM8K line": Case(
        "train", lambda f: [TOY, "--run-dir", f.path("run"), "--set", *SMALL, "task.name=gsm8k", "task.kwargs={}",
                            f"task.data_dir={f.gsm8k_copy('bad', json.dumps({'question': 'q', 'answer': '#### 1'}) + chr(10) + '{oops' + chr(10))}",
                            "correctness_reward=correctness_reward"],
        1, "train.jsonl:2: malformed GSM8K example"),
    "train: data_dir for a generated task": train("task.name=arithmetic", "task.kwargs={}", "task.data_dir=/data",
                                                  "correctness_reward=correctness_reward", status=1,
                                                  needle="task 'arithmetic', split 'train': arithmetic is generated"),
    # -- run directories
    "train: --resume and --overwrite": Case(
        "train", lambda f: [TOY, "--run-dir", f.path("run"), "--resume", "--overwrite", "--set", *SMALL], 1,
        "--resume and --overwrite contradict each other"),
    "train: a directory holding a run": Case(
        "train", lambda f: [TOY, "--run-dir", f.run_dir(metrics=['{"step": 1}']), "--set", *SMALL], 1,
        "already holds a run (metrics.jsonl): pass --resume"),
    "train: resume with another config": Case(
        "train", lambda f: [TOY, "--run-dir", f.run_dir(config=f.toy_config("optimizer.lr=0.5")), "--resume", "--set",
                            *SMALL], 1, "optimizer.lr 0.5 -> 0.001"),
    "train: resume with a damaged config.json": Case(
        "train", lambda f: [TOY, "--run-dir", f.run_dir(config="{not json"), "--resume", "--set", *SMALL], 1,
        "config.json is not valid JSON"),
    "train: run directory is a file": Case(
        "train", lambda f: [TOY, "--run-dir", f.write("afile", "x"), "--set", *SMALL], 1,
        "afile exists and is not a directory; pick another --run-dir", run_dir=None),
    # -- jaxgrpo-compile
    "compile: no topology": Case("compile", lambda f: [TOY], 2, "the following arguments are required: --topology"),
    "compile: bad topology": Case("compile", lambda f: [TOY, "--topology", "v9z:0x1"], 2, "v9z:0x1"),
    "compile: unknown program": Case("compile", lambda f: [TOY, "--topology", "v5e:2x2", "--programs", "train"], 2,
                                     "train"),
    "compile: missing experiment": Case("compile", lambda f: [f.path("nope.py"), "--topology", "v5e:2x2"], 2,
                                        "nope.py' not found"),
    "compile: buckets past the context window": Case(
        "compile", lambda f: [TOY, "--topology", "v5e:2x2", "--set", f"model={f.hf_model(128)}",
                              "sampling.max_new_tokens=200"], 2,
        "sampling.max_prompt_len=256 + sampling.max_new_tokens=200 = 456 positions exceed the context window"),
    "compile: bad --set": Case("compile", lambda f: [TOY, "--topology", "v5e:2x2", "--set", "group_size=0"], 2,
                               "group_size and prompts_per_step must be >= 1"),
    # -- jaxgrpo-plot
    "plot: missing run directory": Case("plot", lambda f: [f.path("nope")], 2, "no metrics.jsonl in"),
    "plot: damaged metrics": Case("plot", lambda f: [f.run_dir(metrics=['{"step": 1, "loss"', '{"step": 2}'])], 1,
                                  "metrics.jsonl, line 1, is not a JSON record"),
    "plot: output path is a file": Case("plot", lambda f: [f.run_dir(metrics=['{"step": 1, "loss": 0.5}']), "--out",
                                                           f.write("out", "x")], 1, "out: File exists; a file of that name is in the way"),
    "plot: no run directory given": Case("plot", lambda f: [], 2, "the following arguments are required: run_dir"),
    # -- jaxgrpo-kernels
    "kernels: unknown kind": Case("kernels", lambda f: ["--kind", "losses"], 2, "unknown kernel kind 'losses'"),
    "kernels: unknown peer": Case("kernels", lambda f: ["--peer", "rllib"], 2, "rllib"),
    "kernels: unknown flag": Case("kernels", lambda f: ["--all"], 2, "unrecognized arguments: --all"),
    # -- jaxgrpo-export
    "export: no --out": Case("export", lambda f: [f.path("run")], 2, "the following arguments are required: --out"),
    "export: missing run directory": Case("export", lambda f: [f.path("nope"), "--out", f.path("o")], 2,
                                          "does not exist"),
    "export: not a run directory": Case("export", lambda f: [f.run_dir(), "--out", f.path("o")], 2, "has no config.json"),
    "export: no checkpoints": Case("export", lambda f: [f.run_dir(config=f.toy_config()), "--out", f.path("o")], 2,
                                   "has no checkpoints"),
    "export: missing step": Case("export", lambda f: [f.run_dir(config=f.toy_config(), checkpoints=[2]), "--out",
                                                      f.path("o"), "--step", "5"], 2, "no checkpoint of step 5"),
    "export: damaged config.json": Case("export", lambda f: [f.run_dir(config="{oops", checkpoints=[1]), "--out",
                                                             f.path("o")], 2, "is not a valid config.json"),
    "export: config.json of a newer version": Case(
        "export", lambda f: [f.run_dir(config={"nonsense": 1}, checkpoints=[1]), "--out", f.path("o")], 2,
        "has a field 'nonsense'"),
    "export: config.json with a bad value": Case(
        "export", lambda f: [f.run_dir(config={**f.toy_config(), "group_size": 0}, checkpoints=[1]), "--out",
                             f.path("o")], 1, "group_size and prompts_per_step must be >= 1"),
    "export: config.json section not an object": Case(
        "export", lambda f: [f.run_dir(config={"sampling": 3}, checkpoints=[1]), "--out", f.path("o")], 2,
        "'sampling' is 3, not a section"),
    # -- jaxgrpo-eval
    "eval: unknown model": Case("eval", lambda f: ["no-such-model"], 2, "'no-such-model' is neither"),
    "eval: unknown split": Case("eval", lambda f: ["toy-tiny", "--task", "toy_sum", "--split", "dev",
                                                   "--set", "correctness_reward=first_char_reward"], 2,
                                "has no split 'dev'"),
    "eval: unknown task": Case("eval", lambda f: ["toy-tiny", "--task", "nosuchtask"], 2, "unknown task 'nosuchtask'"),
    "eval: --num 0": Case("eval", lambda f: ["toy-tiny", "--num", "0"], 2, "--num must be >= 1"),
    "eval: --k 0": Case("eval", lambda f: ["toy-tiny", "--k", "0"], 2, "--k values must be >= 1"),
    "eval: --step without a run": Case("eval", lambda f: ["toy-tiny", "--step", "3"], 2, "--step needs a run directory"),
    "eval: checkpoints but no config": Case("eval", lambda f: [f.run_dir(checkpoints=[1])], 2,
                                            "holds checkpoints but no config.json"),
    "eval: run without the step": Case("eval", lambda f: [f.run_dir(config=f.toy_config(), checkpoints=[2]),
                                                          "--step", "7"], 2, "no checkpoint of step 7"),
    "eval: damaged config.json": Case("eval", lambda f: [f.run_dir(config="[1, 2", checkpoints=[1])], 2,
                                      "is not a valid config.json"),
    "eval: bad --set": Case("eval", lambda f: ["toy-tiny", "--set", "sampling.top_p=2"], 2,
                            "sampling.top_p must be in (0, 1]"),
    "eval: --num not a number": Case("eval", lambda f: ["toy-tiny", "--num", "ten"], 2, "argument --num: invalid int"),
    # -- jaxgrpo-study
    "study: missing study file": Case("study", lambda f: [f.path("nope.py")], 2, "nope.py' not found", run_dir=None),
    "study: --workers 0": Case("study", lambda f: [f.study(), "--workers", "0"], 2, "--workers must be >= 1",
                               run_dir=None),
    "study: study raising": Case("study", lambda f: [f.study("1 / 0"), "--out", f.path("s")], 2, "ZeroDivisionError",
                                 run_dir=None),
    "study: bad grid key": Case("study", lambda f: [f.study(grid="{'optimizer.lrr': [1e-3]}"), "--out", f.path("s")], 2,
                                "grid key 'optimizer.lrr' is not a config field", run_dir=None),
    "study: missing experiment": Case("study", lambda f: [f.study(experiment="nope.py"), "--out", f.path("s")], 2,
                                      "experiment 'nope.py' not found", run_dir=None),
    "study: collate-only and rerun-changed": Case(
        "study", lambda f: [f.study(), "--collate-only", "--rerun-changed"], 2, "pick one", run_dir=None),
}


def _lock_is_free(run_dir: str) -> bool:
    lock = os.path.join(run_dir, "run.lock")
    if not os.path.exists(lock):
        return True
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    finally:
        os.close(fd)


def _run(tool: str, argv: list[str]) -> int:
    try:
        return getattr(cli, f"{tool}_main")(argv)
    except SystemExit as exit_:  # argparse's bad command line
        return exit_.code


def test_the_corpus_covers_every_console_script_with_forty_cases():
    tools = {case.tool for case in CASES.values()}
    assert tools == {"train", "compile", "plot", "kernels", "export", "eval", "study"}
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_error_is_one_line_naming_the_problem_with_no_traceback(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a tool writing a default output path writes it here
    case = CASES[name]
    files = Files(str(tmp_path))
    argv = case.argv(files)
    capsys.readouterr()
    status = _run(case.tool, argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxgrpo-{case.tool}: error: "), lines[0]
    assert case.needle in lines[0], lines[0]
    assert status == case.status, (status, lines[0])
    if case.run_dir is not None:
        assert _lock_is_free(files.path(case.run_dir)), "the run directory is still locked"


def test_a_run_directory_in_use_is_one_line_and_stays_the_holders(tmp_path, capsys):
    from jaxgrpo.run.rundir import RunDirectory

    run_dir = str(tmp_path / "run")
    with RunDirectory.open(run_dir, {}, resume=True):  # another run holds it
        assert cli.train_main([TOY, "--run-dir", run_dir, "--set", *SMALL]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error: run directory "), lines
        assert "is in use by pid" in lines[0] and not _lock_is_free(run_dir)
    assert _lock_is_free(run_dir)


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """Not a user error: an exception outside the family propagates as it is."""
    from jaxgrpo.train import preflight

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(preflight, "check", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        cli.train_main([TOY, "--run-dir", str(tmp_path / "run"), "--set", *SMALL])


def _child_env():
    return processes.child_env()  # as a user runs it: one CPU device


def test_an_error_after_the_model_is_built_is_one_line_from_the_program(tmp_path):
    """As a user runs it (`python -m jaxgrpo.tools.cli`): a kernel reading a field the task lacks is found once the
    trainer has the task's examples; stderr holds that one line and nothing else."""
    run_dir = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "jaxgrpo.tools.cli", TOY, "--run-dir", run_dir, "--set", *SMALL,
                           "advantage=stratified_grpo", "advantage_kwargs.num_strata=2"],
                          capture_output=True, text=True, env=_child_env(), cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("jaxgrpo-train: error: advantage 'stratified_grpo' needs strata_ids"), proc.stderr
    assert _lock_is_free(run_dir)


# Records the name of each program XLA starts compiling in a file, so the test can press Ctrl-C while the
# warm-up's update (`jit_update`, seconds of compilation) compiles.
_SIGINT_DRIVER = """
import faulthandler
import signal
import sys
import time
import jax._src.compiler as compiler

faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack if it hangs

marker, argv = sys.argv[1], sys.argv[2:]
# A child inherits its parent's signal mask and ignored signals, so a test process with SIGINT blocked or ignored
# would hand this run a Ctrl-C it never sees (a shell's never does that). Once, under a full suite's load, a run slept
# through its SIGINT with the cause unseen: note what was inherited, for the failure message, then take SIGINT as
# a shell gives it.
with open(marker, "a") as f:
    f.write(f"inherited:blocked={signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])},"
            f"handler={signal.getsignal(signal.SIGINT)!r}\\n".replace(" ", "_"))
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
signal.signal(signal.SIGINT, signal.default_int_handler)
compile_and_load = compiler.backend_compile_and_load


def marked(backend, module, *args, **kwargs):
    name = str(module.operation.attributes["sym_name"]).strip('"')
    with open(marker, "a") as f:
        f.write(name + "\\n")
    compiled = compile_and_load(backend, module, *args, **kwargs)
    # The update's compilation stays open until the test's Ctrl-C arrives (a cached or fast compile would
    # otherwise end, and the run with it, before a loaded machine's test process sends it).
    if name == "jit_update":
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return compiled


compiler.backend_compile_and_load = marked
from jaxgrpo.tools import cli

sys.argv = ["jaxgrpo-train", *argv]
sys.exit(cli.train_main())
"""


def test_ctrl_c_during_compilation_is_one_line_and_exit_130_without_a_crash(tmp_path):
    """SIGINT while XLA compiles the warm-up's update: `jaxgrpo-train: interrupted`, exit 130, no traceback and no
    segmentation fault (the interpreter's teardown with XLA's threads alive used to crash), the lock released."""
    marker, run_dir = tmp_path / "compiling", str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", _SIGINT_DRIVER, str(marker), TOY, "--run-dir", run_dir, "--set",
                             *SMALL, "warmup_sft_steps=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(),
                            cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and (
                not marker.exists() or "jit_update" not in marker.read_text().split()):
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it compiled its update"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # where every thread of the run was (it failed so once, under load)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"no exit 120 s after SIGINT; what the run noted ({marker.read_text().split()}) "
                                 f"and its threads:\n{err[-6000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert err.strip() == "jaxgrpo-train: interrupted", err[-3000:]
    assert _lock_is_free(run_dir)


def test_a_completion_budget_past_the_models_context_window_is_refused_before_anything_heavy(tmp_path):
    """The Python API too: a model given to the trainer (or built in code) whose window is shorter than
    sampling.max_prompt_len + sampling.max_new_tokens is refused in Trainer(cfg), before the task is read and
    anything is compiled; within the window it builds."""
    from flax import nnx

    from jaxgrpo.data import toy
    from jaxgrpo.models import Decoder
    from jaxgrpo.train import Trainer

    tokenizer = toy.CharTokenizer()
    config = dataclasses.replace(toy.tiny_config(tokenizer.vocab_size), max_position_embeddings=16)
    model = Decoder(config, rngs=nnx.Rngs(0))
    cfg = load_experiment(TOY)
    apply_overrides(cfg, [*SMALL, "sampling.max_prompt_len=12", "sampling.max_new_tokens=8"])
    cfg.run_dir = str(tmp_path / "run")
    with pytest.raises(ValueError) as error:
        Trainer(cfg, model=model, tokenizer=tokenizer)
    assert type(error.value).__name__ == "ConfigError"  # of the family the console scripts print in one line
    message = str(error.value)
    assert message.startswith("sampling.max_prompt_len=12 + sampling.max_new_tokens=8 = 20 positions exceed the "
                              "context window of model 'toy-tiny' (16 positions); lower sampling.max_new_tokens "
                              "to at most 4"), message
    apply_overrides(cfg, ["sampling.max_new_tokens=4"])
    Trainer(cfg, model=model, tokenizer=tokenizer)


def test_an_error_inside_the_run_is_one_line_and_releases_the_run_directory(tmp_path, capsys, monkeypatch):
    """An error found only at the first sampling, with the run directory locked and its config written (a prompt
    whose completions would run past a model's window: the config's max_prompt_len is within it, the real prompt
    is not): one line, exit 1, no traceback, and the lock released for the next run."""
    from flax import nnx

    from jaxgrpo.data import toy
    from jaxgrpo.models import Decoder
    from jaxgrpo.train import state

    def short_window(dtype, remat):
        tokenizer = toy.CharTokenizer()
        config = dataclasses.replace(toy.tiny_config(tokenizer.vocab_size), max_position_embeddings=5)
        return Decoder(config, dtype=dtype, param_dtype=dtype, remat=remat, rngs=nnx.Rngs(0)), tokenizer

    monkeypatch.setitem(state.MODEL_BUILDERS, "toy-short-window", short_window)
    run_dir = str(tmp_path / "run")
    status = cli.train_main([TOY, "--run-dir", run_dir, "--set", *SMALL, "model=toy-short-window",
                             "sampling.max_prompt_len=3", "sampling.max_new_tokens=2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]  # besides the progress bar
    assert "Traceback" not in err and status == 1, err
    assert len(lines) == 1 and lines[0].startswith("jaxgrpo-train: error: prompts[0] has 4 tokens, and with "
                                                   "max_new_tokens=2 its row needs 6 positions"), lines
    assert os.path.exists(os.path.join(run_dir, "config.json"))  # it failed inside the run ...
    assert _lock_is_free(run_dir)  # ... and let go of the directory
