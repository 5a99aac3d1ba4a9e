"""The notebooks run top to bottom on CPU and draw real figures.

Each notebook is stored without outputs, executed here with nbclient in a fresh
kernel (one CPU device, as a user's laptop), and must produce its figures as PNG
outputs that are not blank: decoded, they have many distinct colors and
non-background pixels, as a plot with lines, axes and text does.
"""

from __future__ import annotations

import base64
import io
import os
import re
import time

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO, "notebooks")
#: Figures each notebook must draw (one per plotting cell).
EXPECTED_FIGURES = {"estimators_compared.ipynb": 3, "prototype_advantage.ipynb": 2}
TIME_LIMIT_S = 600  # generous for a loaded CI machine; here each takes well under 2 minutes


def _kernel_env() -> dict:
    """The test session's environment minus conftest's 8 fake devices: a notebook runs on one CPU."""
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def _pngs(notebook) -> list[bytes]:
    images = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if output.get("output_type") in ("display_data", "execute_result") and "image/png" in data:
                images.append(base64.b64decode(data["image/png"]))
    return images


def _assert_real_figure(png: bytes, where: str) -> None:
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png")[..., :3]
    height, width = pixels.shape[:2]
    assert height >= 200 and width >= 300, f"{where}: figure of {width}x{height} pixels is too small to be a plot"
    background = np.all(pixels > 0.97, axis=-1)
    assert 0.02 < 1 - background.mean() < 0.9, f"{where}: {1 - background.mean():.1%} of the pixels are drawn"
    colors = {tuple(c) for c in (pixels.reshape(-1, 3) * 255).astype(np.uint8)[::7]}
    assert len(colors) > 50, f"{where}: only {len(colors)} distinct colors; a blank or flat image, not a plot"
    assert pixels.std() > 0.05, f"{where}: pixel standard deviation {pixels.std():.3f}, nearly uniform"


def test_every_notebook_is_tested():
    assert sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")) == sorted(EXPECTED_FIGURES)


@pytest.mark.parametrize("name", sorted(EXPECTED_FIGURES))
def test_notebook_is_stored_without_outputs(name):
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{name} has no code cells"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"{name}: strip outputs before committing"


@pytest.mark.parametrize("name", sorted(EXPECTED_FIGURES))
def test_notebook_runs_and_draws_real_figures(name, tmp_path):
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=TIME_LIMIT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    start = time.perf_counter()
    client.execute(env=_kernel_env())  # raises CellExecutionError, with the cell and traceback, on any error
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_LIMIT_S, f"{name} took {elapsed:.0f} s"

    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    pngs = _pngs(notebook)
    assert len(pngs) == EXPECTED_FIGURES[name], f"{name} drew {len(pngs)} figures, expected {EXPECTED_FIGURES[name]}"
    for i, png in enumerate(pngs):
        _assert_real_figure(png, f"{name} figure {i + 1}")


def _png_of(draw) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    draw(ax)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def test_figure_check_rejects_blank_figures_and_accepts_plots():
    def blank(ax):
        ax.set_axis_off()

    with pytest.raises(AssertionError):
        _assert_real_figure(_png_of(blank), "blank")

    def plot(ax):
        x = np.linspace(0, 1, 50)
        for k in range(4):
            ax.plot(x, x**k, label=f"x^{k}")
        ax.legend()
        ax.set_title("a plot")

    _assert_real_figure(_png_of(plot), "plot")
