"""Command-line entry points: `jaxgrpo-train`, `jaxgrpo-compile`, `jaxgrpo-plot`, `jaxgrpo-kernels`."""

from __future__ import annotations

import argparse
import json
import os
import sys


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


def train_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxgrpo-train",
        description="Train a policy with a GRPO-family method described by an experiment file.",
    )
    parser.add_argument("experiment", help="an experiment file defining config() -> jaxgrpo.config.Config")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override config fields, e.g. --set optimizer.lr=1e-6 group_size=8")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete what the run directory holds and start over (a fresh run into a non-empty one is refused)")
    parser.add_argument("--run-dir", help="where metrics, plots and checkpoints go (default: the config's run_dir)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    args = parser.parse_args(argv)

    from jaxgrpo.config import ExperimentError, apply_overrides, load_experiment, to_dict, validate

    # Every mistake in the experiment file or the overrides is reported here, in one line, before a model is built.
    try:
        cfg = load_experiment(args.experiment)
        apply_overrides(cfg, args.set)
        if args.run_dir:
            cfg.run_dir = args.run_dir
        validate(cfg)
    except (ExperimentError, FileNotFoundError, AttributeError, TypeError, KeyError, ValueError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxgrpo-train: error: {message}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0

    _distributed_init()
    import jax

    from jaxgrpo.checkpoint import CheckpointError, storage_failure
    from jaxgrpo.config import Config
    from jaxgrpo.metrics import EVAL_FILE, plot_run, read_jsonl
    from jaxgrpo.rundir import RunDirectory, RunDirectoryError, storage_error_message
    from jaxgrpo.trainer import NoLearningSignal, Trainer

    try:  # a used or locked run directory is refused before the model is built (`Trainer.run` checks again)
        RunDirectory.preflight(cfg.run_dir, to_dict(cfg), resume=args.resume, overwrite=args.overwrite,
                               defaults=to_dict(Config()))
    except RunDirectoryError as e:
        print(f"jaxgrpo-train: error: {e}", file=sys.stderr)
        return 1
    trainer = Trainer(cfg)
    try:
        trainer.run(resume=args.resume, overwrite=args.overwrite)
        plots = plot_run(cfg.run_dir) if jax.process_index() == 0 else []
    except (RunDirectoryError, CheckpointError, NoLearningSignal) as e:
        print(f"jaxgrpo-train: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # writing metrics, plots or config.json: a full or read-only disk
        if storage_failure(e) is None:
            raise
        print(f"jaxgrpo-train: error: {storage_error_message(cfg.run_dir, e)}", file=sys.stderr)
        return 1
    if jax.process_index() == 0:
        eval_path = os.path.join(cfg.run_dir, EVAL_FILE)
        if os.path.exists(eval_path):
            evals = read_jsonl(eval_path)
            first, last = evals[0], evals[-1]
            keys = [k for k in last if k != "step"]
            print("held-out evaluation: " + ", ".join(
                f"{k} {first.get(k, float('nan')):.3f} (step {first['step']}) -> {last[k]:.3f} (step {last['step']})" for k in keys))
        print(f"metrics: {os.path.join(cfg.run_dir, 'metrics.jsonl')} (TensorBoard: {os.path.join(cfg.run_dir, 'tensorboard')})")
        print(f"curves: {os.path.dirname(plots[0]) if plots else '(none)'}")
        print(f"checkpoints: {os.path.join(cfg.run_dir, 'checkpoints')}")
    return 0


def compile_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxgrpo-compile",
        description="Compile an experiment's training programs for a TPU topology on this machine (no TPU needed, "
                    "no weights read) and report memory per chip, FLOPs, collectives and host transfers.",
    )
    parser.add_argument("experiment", help="an experiment file defining config() -> jaxgrpo.config.Config")
    parser.add_argument("--topology", required=True, help="a TPU topology, e.g. v5e:2x4 (8 chips), v5p:4x4x4 (64)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument("--programs", nargs="*", default=None, help="which programs (default: update forward)")
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    parser.add_argument("--cpu-forms", action="store_true",
                        help="trace the decoder's CPU-specific forms (bit reads behind barriers, 32-slot cache "
                             "chunks) for the TPU too, to compare with the plain forms a TPU gets by default")
    args = parser.parse_args(argv)
    # A CPU process: the TPU devices come from libtpu's topology description, not from attached chips.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxgrpo.config import ExperimentError, apply_overrides, load_experiment, validate

    try:
        cfg = load_experiment(args.experiment)
        apply_overrides(cfg, args.set)
        validate(cfg)
        from jaxgrpo import compile as aot

        report = aot.compile_experiment(cfg, args.topology, tuple(args.programs or aot.PROGRAMS),
                                        cpu_forms=args.cpu_forms)
    except (ExperimentError, FileNotFoundError, AttributeError, TypeError, KeyError, ValueError, RuntimeError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"jaxgrpo-compile: error: {message}", file=sys.stderr)
        return 2
    print(report.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"report: {args.json}")
    return 0 if aot.fits_everywhere(report) else 1


def plot_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxgrpo-plot", description="Write PNG learning curves of a run directory.")
    parser.add_argument("run_dir")
    parser.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    from jaxgrpo.metrics import plot_run

    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as e:
        print(f"jaxgrpo-plot: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(paths))
    return 0


def kernels_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxgrpo-kernels", description="List the registered kernels.")
    parser.add_argument("--kind", help="only this kind (advantage, loss, ...)")
    args = parser.parse_args(argv)
    import jaxgrpo

    for k in jaxgrpo.list_kernels(args.kind):
        flag = " [experimental]" if k.experimental else ""
        print(f"{k.kind:16s} {k.name:32s} {k.paper}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(train_main())
