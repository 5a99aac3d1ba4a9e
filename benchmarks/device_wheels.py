"""The wheels a lent GPU machine lacks to run jaxgrpo, downloaded here into one folder to carry there.

    python benchmarks/device_wheels.py [--dest .whl] [--list]

The device machines (docs/gpu.md) reach no package index. Their image holds jax 0.11.2 with CUDA, flax 0.12.10,
optax, orbax, chex, transformers and torch (`IMAGE`, as the workplace's KINDS.md listed it on 2026-11-17), but not
all of jaxgrpo's core requirements (TFDS, grain, gguf, qwix, ...). This walks the requirements of the installed
jaxgrpo (their markers evaluated here), stops at every package the image holds (its own requirements are the
image's), downloads a Python 3.12 manylinux wheel of each of the rest at the version installed here and builds the
ones published only as sources (promise):

    python benchmarks/device_wheels.py            # here: .whl/, about 10 MB (.gitignore leaves it out)
    # there, `carry=[".whl"]`: benchmarks/device_run.sh installs them with --target and runs the check
    bash benchmarks/device_run.sh decode

Do not carry flax or jax: flax 0.12.8 (pinned) does not import with the image's jax 0.11.2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys

from packaging.markers import Marker

#: The Python packages of the device machines' image ('cuda'), as KINDS.md listed them on 2026-11-17.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())

#: The platforms a wheel may be built for (the machines run glibc x86-64 Linux; pip matches each tag exactly).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")

#: What one device call may carry, the working tree included (the device tool's limit).
CARRY_LIMIT_BYTES = 64 * 2**20


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])


def _applies(requirement: str) -> bool:
    """Whether a requirement holds on a core install here: its marker true, no extra asked for."""
    if ";" not in requirement:
        return True
    return Marker(requirement.split(";", 1)[1]).evaluate({"extra": ""})


def missing(root: str = "jaxgrpo", image=IMAGE) -> dict[str, str]:
    """{package: version installed here} of `root`'s requirements (recursively, as installed here) that `image`
    lacks, `root` itself left out; a package the image holds is not walked into."""
    found: dict[str, str] = {}
    stack, seen = [canonical(root)], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed here, so its version and requirements are unknown: install "
                             f"jaxgrpo's core here first (pip install -e .), then run this again") from None
        if name != canonical(root):
            found[name] = distribution.version
        stack.extend(_requirement_name(r) for r in distribution.requires or () if _applies(r)
                     and _requirement_name(r) not in image)
    return dict(sorted(found.items()))


def download(packages: dict[str, str], dest: str) -> list[str]:
    """Each package's wheel for CPython 3.12 on x86-64 Linux into `dest`, built here from its sources where none is
    published (pure-Python sources only); the names that had to be built."""
    os.makedirs(dest, exist_ok=True)
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    built = []
    for name, version in packages.items():
        pin = f"{name}=={version}"
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.12", "--implementation", "cp", *platforms, "-d", dest, pin], capture_output=True, text=True)
        if fetched.returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dest, pin], check=True)
            built.append(name)
    return built


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dest", default=".whl",
                        help="the folder of wheels (carry it; device_run.sh installs what .whl/ holds)")
    parser.add_argument("--list", action="store_true", help="only print what the image lacks")
    args = parser.parse_args(argv)
    packages = missing()
    print("the device image lacks:", " ".join(f"{name}=={version}" for name, version in packages.items()))
    if args.list:
        return 0
    built = download(packages, args.dest)
    size = sum(os.path.getsize(os.path.join(args.dest, f)) for f in os.listdir(args.dest))
    print(f"{len(os.listdir(args.dest))} wheels in {args.dest}, {size / 2**20:.1f} MiB"
          + (f" (built here from sources: {', '.join(built)})" if built else ""))
    if size > CARRY_LIMIT_BYTES // 2:
        print(f"warning: {args.dest} is over half of what one device call may carry ({CARRY_LIMIT_BYTES >> 20} MiB, "
              "the working tree included)")
    print(f'there (carry=["{args.dest}"]): bash benchmarks/device_run.sh decode (or train), which installs .whl/*.whl')
    return 0


if __name__ == "__main__":
    sys.exit(main())
