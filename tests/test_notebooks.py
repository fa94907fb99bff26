"""The example notebooks run in a real Jupyter kernel (nbclient + ipykernel) and show their pictures
inline: every plotting cell leaves an image/png output, the viewer cell an iframe whose page carries
no network address. The Bahdanau model trains for a few steps on 2,000 pairs here (the
"parameters" cell is rewritten); the committed notebooks hold the outputs of a full run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = [pytest.mark.slow, pytest.mark.requires("minilm")]

FOLDER = Path(__file__).resolve().parents[1] / "examples" / "notebooks"


def _run(name: str, tmp_path: Path):
    nb = nbformat.read(FOLDER / name, as_version=4)
    parameters = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1, "the notebook has one cell tagged 'parameters'"
    parameters[0].source = "STEPS = 20\nPAIRS = 2000"
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def test_the_tour_runs_in_a_kernel_and_shows_its_pictures_inline(tmp_path):
    nb = _run("attention_tour.ipynb", tmp_path)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors
    pictures = [cell for cell in code if any("image/png" in o.get("data", {}) for o in cell.outputs)]
    # the alignment, the heads, the block mask, the model overview
    assert len(pictures) == 4, [cell.source.splitlines()[-1] for cell in pictures]
    pages = [o["data"]["text/html"] for cell in code for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(pages) == 1 and pages[0].startswith("<iframe srcdoc=")
    assert not re.search(r"(src|href)=&quot;https?:", pages[0])  # the page loads nothing from the network
    assert "all-MiniLM-L6-v2" in pages[0]


def test_the_committed_notebooks_hold_their_outputs():
    for path in FOLDER.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        shown = sum("image/png" in o.get("data", {}) for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
        assert shown >= 4, f"{path.name}: {shown} pictures stored; run examples/notebooks/build.py"


def test_the_committed_notebook_carries_no_path_of_the_machine_that_built_it_and_fits_a_page():
    """no builder's absolute path in a saved output, no picture 16 inches on both sides."""
    import base64
    import struct

    nb = nbformat.read(FOLDER / "attention_tour.ipynb", as_version=4)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    text = nbformat.writes(nb)
    assert "site-packages" not in text and not re.search(r"(/work/|/home/|/root/|/tmp/)", text)
    for output in outputs:
        png = output.get("data", {}).get("image/png")
        if png:
            width, height = struct.unpack(">II", base64.b64decode(png)[16:24])
            assert min(width, height) <= 1500, (width, height)  # the Longformer mask was 1619 x 1579 (16 x 16 in)
