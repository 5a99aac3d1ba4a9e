"""The CPU kernels' build cache: keyed by this CPU, and a damaged cached library is rebuilt, never loaded.

Each test builds into its own cache directory (XDG_CACHE_HOME), so the shared one is never touched.
"""

import ctypes
import logging
import os
import shutil

import pytest

from jaxgrpo.models import cpu_kernels

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="needs a C++ compiler")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache; `library()` forgets what it loaded before and after the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_kernels.library.cache_clear()
    yield tmp_path / "jaxgrpo"
    cpu_kernels.library.cache_clear()


@pytest.fixture
def spy(monkeypatch):
    """Records the paths `library()` builds and loads."""
    calls = {"built": [], "loaded": []}
    build, load = cpu_kernels._build, ctypes.cdll.LoadLibrary

    def recording_build(compiler, path, features):
        calls["built"].append(path)
        build(compiler, path, features)

    def recording_load(path):
        calls["loaded"].append(path)
        return load(path)

    monkeypatch.setattr(cpu_kernels, "_build", recording_build)
    monkeypatch.setattr(ctypes.cdll, "LoadLibrary", recording_load)
    return calls


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(library bytes, record) of one build for this host, made without loading it into this process:
    truncating a library the process has mapped would crash it (SIGBUS)."""
    compiler, features = shutil.which(os.environ.get("CXX", "g++")), cpu_kernels.cpu_features()
    path = str(tmp_path_factory.mktemp("build") / "kernels.so")
    cpu_kernels._build(compiler, path, features)
    return open(path, "rb").read(), open(cpu_kernels._record(path)).read()


def _place(cache, features, library, record):
    """Puts a library and its record into `cache` under the key of a host with `features`; returns its path."""
    path = cpu_kernels._library_path(shutil.which(os.environ.get("CXX", "g++")), features)
    assert path.startswith(str(cache))
    os.makedirs(cache, exist_ok=True)
    with open(path, "wb") as f:
        f.write(library)
    with open(cpu_kernels._record(path), "w") as f:
        f.write(record)
    return path


def test_a_library_built_for_other_cpu_features_is_never_loaded(built, fresh_cache, spy):
    library, record = built
    # A cluster node with other instructions left its library in the shared cache.
    other = _place(fresh_cache, "sse2 avx2", library, record.replace(cpu_kernels.cpu_features(), "sse2 avx2"))
    # This host's key differs: it builds its own library and loads only that.
    assert cpu_kernels.library() is not None
    own = spy["built"][0]
    assert own != other and spy["loaded"] == [own]
    # Even at this host's path, a library whose record names other CPU features is rebuilt, not loaded.
    os.replace(cpu_kernels._record(other), cpu_kernels._record(own))
    cpu_kernels.library.cache_clear()
    assert cpu_kernels.library() is not None
    assert spy["built"] == [own, own] and spy["loaded"] == [own, own]
    assert cpu_kernels._cached_problem(own, cpu_kernels.cpu_features()) is None


@pytest.mark.parametrize("damage", ["truncated", "empty", "record_missing"])
def test_a_damaged_cached_library_is_rebuilt_with_one_warning(damage, built, fresh_cache, spy, caplog):
    library, record = built
    path = _place(fresh_cache, cpu_kernels.cpu_features(), library, record)
    if damage == "truncated":
        with open(path, "r+b") as f:
            f.truncate(len(library) // 2)
    elif damage == "empty":
        open(path, "wb").close()
    else:
        os.remove(cpu_kernels._record(path))
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        lib = cpu_kernels.library()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "rebuilding" in warnings[0].getMessage(), [r.getMessage() for r in warnings]
    assert lib is not None and spy["built"] == [path] and spy["loaded"] == [path]
    assert os.path.getsize(path) > len(library) // 2
    assert cpu_kernels._cached_problem(path, cpu_kernels.cpu_features()) is None
    # The rebuilt library works: its availability probe answers.
    assert lib.jaxgrpo_cpu_matmul_available() in (0, 1)


def test_cpu_features_name_this_machine():
    features = cpu_kernels.cpu_features()
    assert features and features == cpu_kernels.cpu_features()
    if os.path.exists("/proc/cpuinfo") and os.uname().machine == "x86_64":
        assert "sse2" in features.split()
