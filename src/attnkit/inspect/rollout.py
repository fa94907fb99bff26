"""How much each input token reaches each output position through all layers: attention rollout
and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both start from each layer's head-averaged attention with the residual connection added,

    A_l = 0.5 * mean_h(W_l) + 0.5 * I,   rows renormalised to sum to 1,

and view the layers as a graph whose nodes are (layer, token) and whose edge from token j below
to token i above has capacity A_l[i, j].

- rollout multiplies the matrices, R = A_L ... A_2 A_1: R[i, j] is the total weight of all paths
  from input j to output i;
- flow is the maximum flow from input node j to output node i with those capacities (one
  max-flow problem per (i, j) pair, solved with SciPy's Dinic on capacities scaled to integers).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["residual_attention", "attention_rollout", "attention_flow"]

_FLOW_SCALE = 1_000_000  # integer capacities: flows are exact to 1e-6


def residual_attention(attentions: Sequence[torch.Tensor], *, residual: float = 0.5) -> torch.Tensor:
    """(layers, L, L) head-averaged attention with the residual added, from per-layer (H, L, L) or (L, L) weights."""
    if not attentions:
        raise ValueError("attentions is empty: need one (H, L, L) tensor per layer")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1], got {residual}")
    mats: list = []
    for l, a in enumerate(attentions):
        a = torch.as_tensor(a).double()
        if a.ndim == 3:
            a = a.nanmean(0)  # (a head a layer lacks, NaN where layers of several head counts were stacked: none)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"attentions[{l}] must be (H, L, L) or (L, L), got shape {tuple(a.shape)}")
        if mats and a.shape != mats[0].shape:
            raise ValueError(f"attentions[{l}] has shape {tuple(a.shape)}, layer 0 has {tuple(mats[0].shape)}")
        a = (1 - residual) * a + residual * torch.eye(a.shape[0], dtype=a.dtype)
        mats.append(a / a.sum(-1, keepdim=True).clamp_min(1e-30))
    return torch.stack(mats)


def attention_rollout(attentions: Sequence[torch.Tensor], *, residual: float = 0.5) -> torch.Tensor:
    """(L, L) rollout: row i is how much output position i draws on each input token (rows sum to 1)."""
    mats = residual_attention(attentions, residual=residual)
    out = mats[0]
    for a in mats[1:]:
        out = a @ out
    return out


def attention_flow(attentions: Sequence[torch.Tensor], *, residual: float = 0.5,
                   outputs: Sequence[int] | None = None) -> torch.Tensor:
    """(len(outputs), L) attention flow from every input token to each output position (all by default).

    SciPy's max-flow (a core dependency). Cost: one max-flow per (output, input) pair on a graph
    of (layers + 1) x L nodes.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    mats = residual_attention(attentions, residual=residual).numpy()
    layers, L, _ = mats.shape
    outputs = list(range(L)) if outputs is None else list(outputs)
    for i in outputs:
        if not 0 <= i < L:
            raise ValueError(f"outputs must be token positions in [0, {L}), got {i}")
    # Node (l, t) = l * L + t for l = 0..layers; edges go up from (l, j) to (l + 1, i).
    rows, cols, caps = [], [], []
    for l in range(layers):
        targets, sources = np.nonzero(mats[l] > 0)
        rows.append(l * L + sources)
        cols.append((l + 1) * L + targets)
        caps.append(np.maximum(1, np.rint(mats[l][targets, sources] * _FLOW_SCALE)).astype(np.int64))
    n = (layers + 1) * L
    graph = csr_matrix((np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    flow = np.zeros((len(outputs), L))
    for a, i in enumerate(outputs):
        for j in range(L):
            flow[a, j] = maximum_flow(graph, j, layers * L + i, method="dinic").flow_value / _FLOW_SCALE
    return torch.from_numpy(flow)
