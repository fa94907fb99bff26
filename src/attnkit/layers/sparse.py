"""Sparse self-attention layers built on block masks: Longformer (Beltagy et al. 2020).

Longformer's self-attention has two paths with their own projections:

- every real token attends a two-sided band of ``width`` (|i - j| <= width / 2) plus every
  global token, with ``query``/``key``/``value``: one :func:`attnkit.attention` call with a
  :func:`~attnkit.masks.longformer_mod` block mask, so the tiled backend skips everything else;
- global tokens attend every real token with ``query_global``/``key_global``/``value_global``
  (a dense call over the few global rows), and their outputs replace the local ones.

Padding tokens attend nothing (zero output), as in transformers' ``LongformerSelfAttention``,
which this layer equals with copied weights (tests/external/test_longformer.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._deprecated import UNSET, renamed
from ..functional import attention, masks
from ..functional.attention import BACKEND_NAMES, AttentionOutput
from ..functional.checks import check_rank
from ..functional.heads import merge_heads, split_heads
from ..functional.tracing import exporting

__all__ = ["LongformerSelfAttention"]


class LongformerSelfAttention(nn.Module):
    """Longformer self-attention over (B, L, D), batch first.

    Args:
        d_model: D. num_heads: H (E = D / H).
        width: the whole local band, as transformers' ``attention_window`` (even, > 0):
            token i attends tokens j with |i - j| <= width // 2 (``window`` is its deprecated old name).
        dropout: on the attention weights in training mode.
        backend: for the local path (default ``auto``: tiled whenever the block mask is sparse).
        block: tile side of the local path's block mask.

    Parameters: ``query``, ``key``, ``value``, ``query_global``, ``key_global``, ``value_global``
    (D -> D each, with bias), named as in transformers so that its weights load by name. Like
    transformers' layer it returns the heads concatenated, before any output projection.
    """

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    query_global: nn.Linear
    key_global: nn.Linear
    value_global: nn.Linear

    def __init__(
        self, d_model: int, num_heads: int, width=UNSET, dropout: float = 0.0, backend: str = "auto",
        block: int = 128, *, window=UNSET,
    ):
        super().__init__()
        width = renamed("LongformerSelfAttention", "window", "width", window, width, UNSET)
        if d_model < 1 or num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 2 or width % 2:
            raise ValueError(f"width must be an even int >= 2 (transformers' attention_window), got {width!r}")
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.num_heads, self.width = d_model, num_heads, width
        self.dropout, self.backend, self.block = dropout, backend, block
        for name in ("query", "key", "value", "query_global", "key_global", "value_global"):
            setattr(self, name, nn.Linear(d_model, d_model))

    def forward(
        self,
        x: Tensor,
        global_tokens: Tensor | None = None,
        key_mask=UNSET,
        *,
        need_weights: bool = False,
        padding_mask=UNSET,
    ) -> AttentionOutput:
        """x (B, L, D); global_tokens (B, L) boolean, True at global positions (none if None);
        key_mask (B, L) boolean, True at real tokens (all real if None; ``padding_mask`` is its
        deprecated old name).

        Returns:
            :class:`AttentionOutput`: output (B, L, D); with ``need_weights`` the local path's
            weights (B, H, L, L) with global rows zero, as transformers returns them (its global
            rows come separately), else None.
        """
        check_rank("x", x, 3, "(B, L, D)")
        if exporting():
            raise ValueError("LongformerSelfAttention cannot be exported (torch.export): how many global tokens a "
                             "batch has sizes its global pass, and its block mask's tiles are classified on the host "
                             "(data-dependent by design; torch.compile takes it with graph breaks)")
        B, L, D = x.shape
        if D != self.d_model:
            raise ValueError(f"x must have last dim {self.d_model}, got shape {tuple(x.shape)}")
        key_mask = renamed("LongformerSelfAttention", "padding_mask", "key_mask", padding_mask, key_mask, None)
        real = self._flags("key_mask", key_mask, B, L, x.device, default=True)
        is_global = self._flags("global_tokens", global_tokens, B, L, x.device, default=False)
        if torch.compiler.is_compiling():  # compiled or exported: the check stays in the graph, no host read
            torch._assert_async(~(is_global & ~real).any(),
                                "global_tokens marks a padding position (key_mask is False there)")
        elif bool((is_global & ~real).any()):
            raise ValueError("global_tokens marks a padding position (key_mask is False there)")
        dropout = self.dropout if self.training else 0.0

        q = split_heads(self.query(x), self.num_heads)  # (B, H, L, E)
        k = split_heads(self.key(x), self.num_heads)
        v = split_heads(self.value(x), self.num_heads)
        local_mod = masks.and_masks(masks.longformer_mod(self.width, is_global), masks.real_tokens_mod(real))
        local = masks.block_mask(local_mod, B, None, L, L, block=self.block, device=x.device)
        result = attention(q, k, v, mask=local, dropout_p=dropout, backend=self.backend, need_weights=need_weights)
        out = result.output  # (B, H, L, E)
        weights = result.weights

        counts = is_global.sum(dim=1)
        G = int(counts.max()) if B else 0
        if G:
            # The global rows, gathered to (B, G) (stable: in position order), padded with row 0.
            order = torch.argsort((~is_global).to(torch.int8), dim=1, stable=True)[:, :G]  # (B, G)
            valid = torch.arange(G, device=x.device)[None, :] < counts[:, None]  # (B, G)
            rows = torch.gather(x, 1, order[..., None].expand(B, G, D))
            q_g = split_heads(self.query_global(rows), self.num_heads)  # (B, H, G, E)
            k_g = split_heads(self.key_global(x), self.num_heads)
            v_g = split_heads(self.value_global(x), self.num_heads)
            global_out = attention(q_g, k_g, v_g, mask=real[:, None, None, :], dropout_p=dropout, backend=self.backend).output
            E = out.shape[-1]
            index = order[:, None, :, None].expand(B, self.num_heads, G, E)
            keep = valid[:, None, :, None]
            current = torch.gather(out, 2, index)
            out = out.scatter(2, index, torch.where(keep, global_out, current))
            if weights is not None:
                weights = weights.masked_fill(is_global[:, None, :, None], 0.0)
        return AttentionOutput(output=merge_heads(out), weights=weights)

    @staticmethod
    def _flags(name: str, flags: Tensor | None, B: int, L: int, device, *, default: bool) -> Tensor:
        if flags is None:
            return torch.full((B, L), default, dtype=torch.bool, device=device)
        if not isinstance(flags, Tensor) or flags.dtype != torch.bool or tuple(flags.shape) != (B, L):
            got = (flags.dtype, tuple(flags.shape)) if isinstance(flags, Tensor) else type(flags).__name__
            raise ValueError(f"{name} must be a boolean tensor of shape (B, L) = ({B}, {L}), got {got}")
        return flags

