"""The notebooks run top to bottom on CPU and draw real figures.

Each notebook is committed executed, so a reader sees its figures: `python tests/test_notebooks.py` runs each
in a fresh kernel (one CPU device, as a user's laptop) and writes it back with its outputs (warnings on stderr
left out). Here a copy is executed again with nbclient, and both the committed outputs and the fresh ones must
hold the notebook's figures as PNG outputs that are not blank: decoded, they have many distinct colors and
non-background pixels, as a plot with lines, axes and text does.
"""

from __future__ import annotations

import base64
import io
import os
import time

import numpy as np
import pytest

from tests.support import processes
from tests.support.paths import REPO_ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = REPO_ROOT
NOTEBOOKS = os.path.join(REPO, "notebooks")
#: Figures each notebook must draw (one per plotting cell).
EXPECTED_FIGURES = {"estimators_compared.ipynb": 3, "prototype_advantage.ipynb": 2}
TIME_LIMIT_S = 600  # generous for a loaded CI machine; here each takes well under 2 minutes


def _kernel_env() -> dict:
    """The test session's environment minus conftest's 8 fake devices: a notebook runs on one CPU."""
    return processes.child_env(MPLBACKEND="module://matplotlib_inline.backend_inline")


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


#: The most a committed notebook may weigh, its figures included.
MAX_BYTES = 400_000


def execute(name: str, directory: str):
    """The notebook `name` run top to bottom in a fresh kernel whose working directory is `directory`; raises
    nbclient's CellExecutionError, with the cell and traceback, on any error."""
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=TIME_LIMIT_S, kernel_name="python3", resources={"metadata": {"path": directory}}
    )
    client.execute(env=_kernel_env())
    return notebook


def _assert_executed_with_figures(notebook, name: str) -> None:
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{name} has no code cells"
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), (
        f"{name} was not run top to bottom; run python tests/test_notebooks.py")
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    pngs = _pngs(notebook)
    assert len(pngs) == EXPECTED_FIGURES[name], f"{name} drew {len(pngs)} figures, expected {EXPECTED_FIGURES[name]}"
    for i, png in enumerate(pngs):
        _assert_real_figure(png, f"{name} figure {i + 1}")


@pytest.mark.parametrize("name", sorted(EXPECTED_FIGURES))
def test_notebook_is_committed_executed_with_its_figures(name):
    path = os.path.join(NOTEBOOKS, name)
    assert os.path.getsize(path) < MAX_BYTES, f"{name} weighs {os.path.getsize(path)} bytes; draw smaller figures"
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    _assert_executed_with_figures(notebook, name)


@pytest.mark.parametrize("name", sorted(EXPECTED_FIGURES))
def test_notebook_runs_and_draws_real_figures(name, tmp_path):
    start = time.perf_counter()
    notebook = execute(name, str(tmp_path))
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_LIMIT_S, f"{name} took {elapsed:.0f} s"
    _assert_executed_with_figures(notebook, name)


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


def _smaller_png(encoded: str) -> str:
    from PIL import Image

    smaller = io.BytesIO()
    Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB").quantize(colors=128).save(
        smaller, format="PNG", optimize=True)
    return base64.b64encode(smaller.getvalue()).decode()


if __name__ == "__main__":  # python tests/test_notebooks.py: run every notebook and commit it with its outputs
    import tempfile

    for name in sorted(EXPECTED_FIGURES):
        with tempfile.TemporaryDirectory() as directory:
            executed = execute(name, directory)
        for cell in executed.cells:
            if cell.cell_type == "code":  # warnings on stderr are the host's, not the notebook's
                cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
                for output in cell.outputs:  # figures in 128 colors: a quarter of the bytes, the same plot to a reader
                    if "image/png" in output.get("data", {}):
                        output.data["image/png"] = _smaller_png(output.data["image/png"])
        nbformat.write(executed, os.path.join(NOTEBOOKS, name))
        print(f"wrote notebooks/{name} ({os.path.getsize(os.path.join(NOTEBOOKS, name))} bytes)")
