"""Command-line entry points: `jaxgrpo-train`, `jaxgrpo-compile`, `jaxgrpo-plot`, `jaxgrpo-kernels`, `jaxgrpo-export`,
`jaxgrpo-eval`, `jaxgrpo-study`.

Every error a user can cause is one line on stderr, `jaxgrpo-<tool>: error: <what is wrong and what to do>`, with
exit status 2 for a bad command line or config (found before anything is built) and 1 for what fails later (a run
directory in use, data, a checkpoint, a disk). What counts as the user's is a family of exception types
(`jaxgrpo.errors.UserError`, and OSErrors naming a path: `jaxgrpo.errors.os_error_message`); any other exception
is a bug and keeps its traceback. Ctrl-C prints `jaxgrpo-<tool>: interrupted` and exits with 130: the program leaves
with `os._exit` once the run directory's lock is released and the output flushed, so the interpreter's teardown,
which crashes while XLA's compiler threads are alive, never runs (`_entry_point`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Callable

#: Exit status of a run stopped by Ctrl-C (SIGINT): 128 + the signal's number, as shells report it.
INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line as one line (`prog: error: ...`, exit 2) instead of usage and error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _fail(prog: str, message, status: int) -> int:
    from jaxgrpo.errors import one_line

    text = one_line(message) if isinstance(message, BaseException) else " ".join(str(message).split())
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return status


def _entry_point(prog: str) -> Callable:
    """Wraps a `*_main(argv)`: an exception of the user-error family is one line and exit 1; Ctrl-C is
    `prog: interrupted` and exit 130; anything else (a bug) propagates with its traceback.

    Called as the program (`argv` None, as the console scripts call it), an interrupted run leaves with
    `os._exit(130)` after the output is flushed: the `with` blocks on the way out have released the run
    directory's lock by then, and skipping the interpreter's teardown avoids the crash it meets while XLA's
    threads (a compilation) are still alive. Called from Python (a test, a notebook) it returns 130.
    """
    def wrap(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                sys.stdout.flush()
                if argv is None:
                    os._exit(INTERRUPTED)
                return INTERRUPTED
            except Exception as error:
                from jaxgrpo.errors import UserError, os_error_message

                if isinstance(error, UserError):
                    return _fail(prog, error, 1)
                if isinstance(error, OSError) and os_error_message(error) is not None:
                    return _fail(prog, os_error_message(error), 1)
                raise

        return run

    return wrap


def _distributed_init() -> None:
    """Joins a multi-host run when the launcher says so.

    `JAX_COORDINATOR_ADDRESS` (with `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`, as
    `launch/slurm.sbatch` exports them), or `JAXGRPO_DISTRIBUTED=1` on a TPU pod,
    where JAX finds its peers by itself.
    """
    import jax

    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        kwargs = {}
        if "JAX_NUM_PROCESSES" in os.environ:
            kwargs["num_processes"] = int(os.environ["JAX_NUM_PROCESSES"])
        if "JAX_PROCESS_ID" in os.environ:
            kwargs["process_id"] = int(os.environ["JAX_PROCESS_ID"])
        jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], **kwargs)
    elif os.environ.get("JAXGRPO_DISTRIBUTED") == "1":
        jax.distributed.initialize()


@_entry_point("jaxgrpo-train")
def train_main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="jaxgrpo-train",
        description="Train a policy with a GRPO-family method described by an experiment file.",
    )
    parser.add_argument("experiment", help="an experiment file defining config() -> jaxgrpo.config.Config")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override config fields, e.g. --set optimizer.lr=1e-6 group_size=8")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run directory's run files and start over (a fresh run into a non-empty one is refused; "
                             "so is --overwrite of a directory holding files no run wrote)")
    parser.add_argument("--run-dir", help="where metrics, plots and checkpoints go (default: the config's run_dir)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="trace STEPS steps after the first (which compiles) with jax.profiler into "
                             "RUN_DIR/profile/steps_<first>-<last>/ and write there where they went: host phases, "
                             "compiled programs, the model's parts (summary.md)")
    args = parser.parse_args(argv)

    from jaxgrpo.config import ExperimentError, apply_overrides, load_experiment, to_dict, validate

    # Every mistake in the experiment file or the overrides is reported here, in one line, before a model is built:
    # these calls only read and check what the user gave, so each of these exception types is the user's.
    try:
        cfg = load_experiment(args.experiment)
        apply_overrides(cfg, args.set)
        if args.run_dir:
            cfg.run_dir = args.run_dir
        validate(cfg)
    except (ExperimentError, FileNotFoundError, AttributeError, TypeError, KeyError, ValueError) as e:
        return _fail("jaxgrpo-train", e, 2)
    if args.profile < 0 or (args.profile and not args.resume and args.profile + 1 > cfg.steps):
        return _fail("jaxgrpo-train", f"--profile {args.profile} needs a number of steps >= 0 that leaves the run's "
                                      f"first step (which compiles) untraced, here at most {cfg.steps - 1}; raise steps "
                                      f"or profile fewer", 2)
    if args.print_config:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0

    _distributed_init()
    import jax

    from jaxgrpo.config import Config, resolve_packing
    from jaxgrpo.errors import ConfigError
    from jaxgrpo.run.checkpoint import CheckpointError, storage_failure
    from jaxgrpo.run.metrics import plot_run
    from jaxgrpo.run.rundir import RunDirectory, RunDirectoryError, storage_error_message
    from jaxgrpo.train import preflight
    from jaxgrpo.train.health import NoLearningSignal, NonFiniteUpdates
    from jaxgrpo.train.loop import Trainer

    try:  # the task, rewards, model, context budget and mesh the config names, before anything is built
        preflight.check(cfg, num_devices=jax.device_count(), num_processes=jax.process_count())
    except ConfigError as e:
        return _fail("jaxgrpo-train", e, 2)
    try:  # a used or locked run directory is refused before the model is built (`Trainer.run` checks again)
        # As `Trainer` will save it: packing=None settled for this platform.
        RunDirectory.preflight(cfg.run_dir, to_dict(resolve_packing(cfg, jax.default_backend())), resume=args.resume,
                               overwrite=args.overwrite,
                               defaults=to_dict(Config()))
    except RunDirectoryError as e:
        print(f"jaxgrpo-train: error: {e}", file=sys.stderr)
        return 1
    # Any other user error from here on (data, a model, a checkpoint) is one line from `_entry_point`.
    trainer = Trainer(cfg)
    try:
        trainer.run(resume=args.resume, overwrite=args.overwrite, profile=args.profile)
        plots = plot_run(cfg.run_dir) if jax.process_index() == 0 else []
    except (RunDirectoryError, CheckpointError, NoLearningSignal, NonFiniteUpdates) as e:
        print(f"jaxgrpo-train: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # writing metrics, plots or config.json: a full or read-only disk
        if storage_failure(e) is None:
            raise
        print(f"jaxgrpo-train: error: {storage_error_message(cfg.run_dir, e)}", file=sys.stderr)
        return 1
    if jax.process_index() == 0:
        _print_run_summary(cfg.run_dir, plots)
    return 0


def _print_run_summary(run_dir: str, plots: list[str]) -> None:
    """What a finished `jaxgrpo-train` run prints: its held-out evaluation from first to last, and where its
    metrics, curves and checkpoints are."""
    from jaxgrpo.run.metrics import EVAL_FILE, read_jsonl

    eval_path = os.path.join(run_dir, EVAL_FILE)
    if os.path.exists(eval_path):
        evals = read_jsonl(eval_path)
        first, last = evals[0], evals[-1]
        keys = [k for k in last if k != "step"]
        print("held-out evaluation: " + ", ".join(
            f"{k} {first.get(k, float('nan')):.3f} (step {first['step']}) -> {last[k]:.3f} (step {last['step']})" for k in keys))
    print(f"metrics: {os.path.join(run_dir, 'metrics.jsonl')} (TensorBoard: {os.path.join(run_dir, 'tensorboard')})")
    print(f"curves: {os.path.dirname(plots[0]) if plots else '(none)'}")
    print(f"checkpoints: {os.path.join(run_dir, 'checkpoints')}")


@_entry_point("jaxgrpo-compile")
def compile_main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="jaxgrpo-compile",
        description="Compile an experiment's training programs for a TPU topology on this machine (no TPU needed, "
                    "no weights read) and report memory per chip, FLOPs, collectives and host transfers, and "
                    "roofline estimates of their time, each beside how far a measured run was from its estimate.",
    )
    parser.add_argument("experiment", help="an experiment file defining config() -> jaxgrpo.config.Config")
    parser.add_argument("--topology", required=True, help="a TPU topology, e.g. v5e:2x4 (8 chips), v5p:4x4x4 (64)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument("--programs", nargs="*", default=None,
                        help="which programs: engine (the rollout engine's prefill and decode chunk, its KV pool at "
                             "two fill levels), forward, update (the default: all three, those a run runs)")
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    parser.add_argument("--cpu-forms", action="store_true",
                        help="trace the decoder's CPU-specific forms (bit reads behind barriers, 32-slot cache "
                             "chunks) for the TPU too, to compare with the plain forms a TPU gets by default")
    parser.add_argument("--calibration", nargs="*", default=None, metavar="PATH",
                        help="measured runs to calibrate the estimates against, beside those committed in "
                             "jaxgrpo.tools.calibration: device-check results (device_check_*.json, or directories "
                             "holding them; default: benchmarks/results, where it exists)")
    args = parser.parse_args(argv)
    # A CPU process: the TPU devices come from libtpu's topology description, not from attached chips.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxgrpo.config import ExperimentError, apply_overrides, load_experiment, validate

    try:
        cfg = load_experiment(args.experiment)
        apply_overrides(cfg, args.set)
        validate(cfg)
        from jaxgrpo.train import preflight

        preflight.check_budget(cfg, preflight.model_config_of(cfg))  # the buckets fit the model's context window
        from jaxgrpo.tools import calibration
        from jaxgrpo.tools import compile as aot

        calibrations = calibration.load(["benchmarks/results"] if args.calibration is None else args.calibration)
        report = aot.compile_experiment(cfg, args.topology, args.programs or None,
                                        cpu_forms=args.cpu_forms, calibrations=calibrations)
    except (ExperimentError, FileNotFoundError, AttributeError, TypeError, KeyError, ValueError, RuntimeError) as e:
        return _fail("jaxgrpo-compile", e, 2)
    print(report.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"report: {args.json}")
    return 0 if aot.fits_everywhere(report) else 1


@_entry_point("jaxgrpo-plot")
def plot_main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="jaxgrpo-plot", description="Write PNG learning curves of a run directory.")
    parser.add_argument("run_dir")
    parser.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    from jaxgrpo.run.metrics import plot_run

    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as e:
        print(f"jaxgrpo-plot: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(paths))
    return 0


@_entry_point("jaxgrpo-kernels")
def kernels_main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="jaxgrpo-kernels", description="List the registered kernels.")
    parser.add_argument("--kind", help="only this kind (advantage, loss, ...)")
    parser.add_argument("--peer", help="instead, how the kernels of a peer library (verl, trl, tunix) map to ours")
    args = parser.parse_args(argv)
    import jaxgrpo

    if args.peer is not None:
        from jaxgrpo.catalog import peers

        try:
            rows = peers.table(args.peer, mark_unavailable=True)
        except ValueError as e:
            print(f"jaxgrpo-kernels: error: {e}", file=sys.stderr)
            return 2
        peer = peers.PEERS[args.peer]
        source = f"  # {peer.source_note}" if peer.source_note else ""
        print(f"{peer.repository} at {peer.pin} ({', '.join(peer.files)}){source}")
        for setting, name, ours, options, note, differences in rows:
            line = f"{setting:28s} {name:36s} -> {ours:40s} {options}"
            line = line.rstrip() + (f"  # {note}" if note else "")
            print(line + (f"  # differs: {differences}" if differences else ""))
        return 0
    try:
        listed = jaxgrpo.list_kernels(args.kind)
    except ValueError as e:  # an unknown --kind; the message lists the kinds
        return _fail("jaxgrpo-kernels", f"--kind: {e}", 2)
    for k in listed:
        flag = " [experimental]" if k.experimental else ""
        print(f"{k.kind:16s} {k.name:32s} {k.paper}{flag}")
    return 0


@_entry_point("jaxgrpo-export")
def export_main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="jaxgrpo-export",
        description="Write a run's trained policy as a Hugging Face model directory (config.json, model.safetensors, "
                    "tokenizer with its chat template) that transformers loads as it is; a LoRA run's merged, or its "
                    "adapters alone for peft (--peft), or its base (--base).",
    )
    parser.add_argument("run_dir", help="a run directory of jaxgrpo-train (config.json and checkpoints/)")
    parser.add_argument("--out", required=True, help="the directory to write")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out, replacing the files an export writes (others are kept)")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--peft", action="store_true",
                      help="a LoRA run: write its adapters alone in PEFT's format (adapter_config.json, "
                           "adapter_model.safetensors) instead of the merged model")
    form.add_argument("--base", action="store_true",
                      help="a LoRA run: write the base model its adapters apply to (dequantized under QLoRA)")
    args = parser.parse_args(argv)
    from jaxgrpo.evaluation import runs
    from jaxgrpo.models import UnsupportedConfigError, WeightFileError
    from jaxgrpo.tools import export

    chosen = "peft" if args.peft else "base" if args.base else "model"
    try:
        out, step = export.export_run(args.run_dir, args.out, step=args.step, overwrite=args.overwrite, form=chosen)
    except (runs.RunReadError, export.ExportError, UnsupportedConfigError, WeightFileError, KeyError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxgrpo-export: error: {message}", file=sys.stderr)
        return 2
    if chosen == "peft":
        print(f"exported the adapters of step {step} of {args.run_dir} to {out}: load them with "
              f"peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), {out!r}), BASE the run's "
              f"base in Hugging Face's format (jaxgrpo-export {args.run_dir} --base --out BASE writes it)")
    else:
        print(f"exported {'the base of ' if args.base else ''}step {step} of {args.run_dir} to {out}: load it with "
              f"transformers.AutoModelForCausalLM.from_pretrained({out!r}) and AutoTokenizer.from_pretrained({out!r})")
    return 0


@_entry_point("jaxgrpo-eval")
def eval_main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="jaxgrpo-eval",
        description="Greedy accuracy (Wilson 95% interval) and pass@k (bootstrap 95% interval over questions) of a "
                    "run's checkpoint or of a base model on a task split; writes every completion to a JSONL file.",
    )
    parser.add_argument("target", help="a run directory (its newest checkpoint, or --step), or a model: a registered "
                                        "name, a Hugging Face directory, a .gguf file or a built-in (toy-tiny)")
    parser.add_argument("--task", help="a registered task, e.g. arithmetic, gsm8k (default: the run's task)")
    parser.add_argument("--split", help="the split to evaluate (default: the run's evaluation split, else test)")
    parser.add_argument("--num", type=int, help="the first N questions of the split (default: the run's "
                                                  "num_eval_examples, else 200)")
    parser.add_argument("--k", type=int, nargs="+", help="pass@k for each k, from max(k) samples per question "
                                                         "(default: 1 and the run's eval_pass_k)")
    parser.add_argument("--step", type=int, help="the run's checkpoint to evaluate (default: the newest)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override config fields, e.g. sampling.max_new_tokens=64 task.kwargs={'digits':2}")
    parser.add_argument("--out", help="the completions' JSONL (default: RUN_DIR/eval_<split>_step<N>.jsonl, "
                                      "else eval_<split>.jsonl here); the summary goes beside it as .summary.json")
    args = parser.parse_args(argv)

    from jaxgrpo.config import apply_overrides, validate
    from jaxgrpo.evaluation import policy_eval, runs
    from jaxgrpo.models import UnsupportedConfigError, WeightFileError

    # Everything is checked here, in one line each, before a model is built.
    try:
        run_dir = args.target if runs.is_run_dir(args.target) else None
        if run_dir is not None:
            cfg = runs.read_config(run_dir)
            step = runs.choose_step(run_dir, args.step)
        else:
            cfg, step = _model_eval_config(args.target, args.step), 0
        if args.task and args.task != cfg.task.name:
            cfg.task.name, cfg.task.kwargs = args.task, {}
        apply_overrides(cfg, args.set)
        if args.split:
            cfg.task.eval_split = args.split
        if args.num is not None:
            if args.num < 1:
                raise ValueError(f"--num must be >= 1, got {args.num}")
            cfg.task.num_eval_examples = args.num
        ks = args.k or sorted({1, cfg.eval_pass_k})
        if min(ks) < 1:
            raise ValueError(f"--k values must be >= 1, got {ks}")
        validate(cfg)
        from jaxgrpo.train import preflight

        preflight.check(cfg)  # the task, rewards, model and context budget the config names
        policy_eval.check_split(cfg, cfg.task.eval_split)
    except (runs.RunReadError, policy_eval.EvalSetupError, UnsupportedConfigError, WeightFileError, KeyError,
            ValueError, TypeError) as e:
        return _fail("jaxgrpo-eval", e, 2)

    try:
        trainer, _ = runs.build_trainer(cfg, run_dir, step if run_dir else None)
    except runs.RunReadError as e:  # a checkpoint that does not restore, or whose arrays fail their checksums
        return _fail("jaxgrpo-eval", e, 2)
    result = policy_eval.evaluate_policy(trainer, trainer.eval_examples, ks, step=step)
    split = cfg.task.eval_split
    out = args.out or (os.path.join(run_dir, f"eval_{split}_step{step}.jsonl") if run_dir else f"eval_{split}.jsonl")
    policy_eval.write_jsonl(out, result.records)
    summary = {"target": args.target, "step": step if run_dir else None, "task": cfg.task.name, "split": split,
               **result.summary()}
    with open(os.path.splitext(out)[0] + ".summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    what = f"{run_dir} step {step}" if run_dir else cfg.model
    print(f"{what} on {cfg.task.name}/{split}, {result.num_questions} questions, "
          f"{result.samples_per_question} samples each:")
    for name, interval in result.metrics.items():
        how = "bootstrap over questions" if name.startswith("pass@") else "Wilson"
        print(f"  {name:16s} {interval.format()}  (95% interval, {how})")
    print(f"completions: {out}")
    return 0


def _model_eval_config(target: str, step: int | None):
    """`jaxgrpo-eval`'s config for a model (not a run directory): the defaults with `target` as the model and 200
    questions; a directory of checkpoints without its config, a --step, or a model that does not load are refused."""
    from jaxgrpo.config import Config
    from jaxgrpo.evaluation import runs
    from jaxgrpo.train.state import MODEL_BUILDERS

    if os.path.isdir(target) and os.path.isdir(os.path.join(target, runs.CHECKPOINTS)):
        raise runs.RunReadError(f"{target} holds checkpoints but no config.json; it is not a complete run directory")
    if step is not None:
        raise runs.RunReadError("--step needs a run directory; a model is evaluated as it is")
    cfg = Config()
    cfg.model = target
    cfg.task.num_eval_examples = 200
    if cfg.model not in MODEL_BUILDERS:
        from jaxgrpo.models import load_config

        load_config(cfg.model)  # a missing or unsupported model fails here, not after a long build
    return cfg


@_entry_point("jaxgrpo-study")
def study_main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="jaxgrpo-study",
        description="Run a study file's grid (configurations x seeds, one run directory per cell; resumable) and "
                    "collate it: mean and 95% t-interval over seeds per metric, plots and report.md.",
    )
    parser.add_argument("study", help="a study file defining study() -> jaxgrpo.evaluation.study.Study")
    parser.add_argument("--out", help="the study directory (default: runs/studies/<study name>)")
    parser.add_argument("--workers", type=int, default=1, help="cells run at once, each in its own process (default 1)")
    parser.add_argument("--collate-only", action="store_true", help="run nothing; report the cells finished so far")
    parser.add_argument("--no-compilation-cache", action="store_true",
                        help="do not share JAX's persistent compilation cache between the cells")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="run again, from scratch, the cells whose recorded config differs from the one the "
                             "study now gives them (without it such cells are an error)")
    args = parser.parse_args(argv)
    from jaxgrpo.evaluation import study as studies

    try:
        if args.workers < 1:
            raise studies.StudyError(f"--workers must be >= 1, got {args.workers}")
        if args.collate_only and args.rerun_changed:
            raise studies.StudyError("--collate-only runs nothing and --rerun-changed runs cells again: pick one")
        study, experiment = studies.load_study(args.study)
        out = args.out or os.path.join("runs", "studies", study.name)
        runner = studies.Runner(study, experiment, out, compilation_cache=not args.no_compilation_cache,
                                rerun_changed=args.rerun_changed)
    except studies.StudyError as e:
        print(f"jaxgrpo-study: error: {e}", file=sys.stderr)
        return 2
    print(f"[study] {study.name}: {len(runner.cells)} cells into {out}"
          + (f", {args.workers} at a time" if args.workers > 1 else ""), flush=True)
    complete = True if args.collate_only else runner.run(args.workers)
    command = " ".join(["jaxgrpo-study", args.study] + (["--out", args.out] if args.out else [])
                       + (["--workers", str(args.workers)] if args.workers > 1 else []))
    path = studies.report(runner, args.study, command)
    print(studies.table(studies.collate(runner)))
    print(f"report: {path}")
    if not complete:
        print("jaxgrpo-study: error: some cells failed (their logs are named above); rerun to retry them",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(train_main())
