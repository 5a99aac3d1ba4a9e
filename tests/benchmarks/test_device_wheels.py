"""benchmarks/device_wheels.py finds which of jaxgrpo's requirements a device machine's image lacks: checked on the
install here (nothing is downloaded)."""

import os
import sys

import pytest

from tests.support.paths import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import device_wheels  # noqa: E402


def test_the_image_lacks_the_data_and_weight_readers_not_jax():
    lacking = device_wheels.missing()
    for name in ("tensorflow-datasets", "grain", "gguf", "qwix", "promise", "array-record", "tensorboardx"):
        assert name in lacking, name
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "transformers", "numpy", "jaxgrpo"):
        assert name not in lacking, name
    # at the version installed here
    assert lacking["gguf"] == "0.19.0" and lacking["tensorflow-datasets"] == "4.9.10"


def test_a_package_the_image_holds_is_not_walked_into():
    # without orbax in the image, its own requirements (tensorstore, ...) are carried too, unless the image has them
    lacking = device_wheels.missing(image=device_wheels.IMAGE - {"orbax-checkpoint"})
    assert "orbax-checkpoint" in lacking and "tensorstore" not in lacking
    lacking = device_wheels.missing(image=device_wheels.IMAGE - {"orbax-checkpoint", "tensorstore"})
    assert {"orbax-checkpoint", "tensorstore"} <= set(lacking)
    # an image with everything lacks nothing; an empty one lacks jax itself
    assert device_wheels.missing(image=frozenset(device_wheels.missing(image=frozenset()))) == {}
    assert "jax" in device_wheels.missing(image=frozenset())


def test_requirement_names_and_markers():
    assert device_wheels._requirement_name("Array_Record>=0.7") == "array-record"
    assert device_wheels._requirement_name("importlib_resources; python_version < '3.9'") == "importlib-resources"
    assert device_wheels._applies("numpy>=1.26")
    assert not device_wheels._applies("importlib_resources; python_version < '3.9'")
    assert not device_wheels._applies("torch; extra == 'parity'")


def test_a_requirement_not_installed_here_is_named_with_the_fix():
    with pytest.raises(SystemExit, match="no-such-package is not installed here.*pip install -e ."):
        device_wheels.missing(root="no-such-package")
