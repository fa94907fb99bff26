"""What the hybrid decoders share (Qwen3-Next and Qwen3.5, Kimi Linear, MiniMax-01): layers of two kinds
(``layer_types``), a linear-attention layer that reads the call's own tokens and carries a constant-size state, a
softmax one that attends over its cache, and one forward around them.

    x = embed(ids);  for each layer: x = block(x);  logits = lm_head(norm(x))
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from ..functional import kept
from ..functional.checks import check_rank
from ..layers import KVCache, LinearStateCache
from ..layers.calls import called, project_by_name
from .blocks import layer_key_masks, normalised
from .config_values import Value, checked_values
from .hf_config import UnsupportedConfigError, means_none
from .outputs import LMOutput

__all__ = ["LINEAR", "FEED_FORWARD_ONLY", "HARMLESS", "checked_keys", "json_float", "mix", "HybridLM"]

LINEAR = "linear_attention"
"""The ``layer_types`` entry of a linear-attention layer (every other one is softmax attention, or one of
:data:`FEED_FORWARD_ONLY`)."""

FEED_FORWARD_ONLY = frozenset({"mlp", "moe"})
"""The ``layer_types`` entries of a layer with no token mixer (Nemotron-H's MLP and mixture-of-experts layers): no
cache, no attention."""


HARMLESS = frozenset({
    "_name_or_path", "architectures", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
    "decoder_start_token_id", "dtype", "eos_token_id", "finetuning_task", "id2label", "initializer_range",
    "is_decoder", "is_encoder_decoder", "label2id", "name_or_path", "output_attentions", "output_hidden_states",
    "output_router_logits", "pad_token_id", "prefix", "problem_type", "pruned_heads", "return_dict",
    "router_aux_loss_coef", "sep_token_id", "task_specific_params", "tie_encoder_decoder", "tokenizer_class",
    "torch_dtype", "torchscript", "transformers_version", "use_cache", "use_return_dict",
})
"""``config.json`` keys the hybrids' loaders take as harmless in evaluation (bookkeeping, token ids, initialisation,
dropout, router losses, output switches); each loader adds its family's own. (hf_config's ``_HARMLESS_ANY`` is the
named families' list: close to this one, not the same, and merging them would widen what some loader takes.)"""


def checked_keys(hf: object, kinds: tuple[str, ...], read: Mapping[str, Value],
                 harmless: set[str] | frozenset[str], required: tuple[str, ...]) -> str:
    """The ``model_type`` of a hybrid's ``config.json`` after the checks every hybrid loader makes, each failure an
    :class:`UnsupportedConfigError` naming what it found: a model type of ``kinds``, every key read or harmless,
    every ``required`` key there (and not null), every value read of the kind ``read`` names for its key
    (:mod:`.config_values`)."""
    kind = hf.get("model_type") if isinstance(hf, dict) else None
    if kind not in kinds:
        raise UnsupportedConfigError(f"model_type must be {' or '.join(map(repr, kinds))}, got "
                                     f"{kind if isinstance(hf, dict) else hf!r}")
    assert isinstance(hf, dict)
    unknown = sorted(key for key in set(hf) - set(read) - harmless if not means_none(key, hf[key]))
    if unknown:
        raise UnsupportedConfigError(f"{kind} config: keys attnkit does not implement: {unknown}")
    checked_values(hf, kind, read)
    missing = [key for key in required if hf.get(key) is None]
    if missing:
        raise UnsupportedConfigError(f"{kind} config: missing keys {missing} (the model needs them)")
    return kind


def json_float(value, where: str) -> float:
    """A number of a config.json: a JSON number, or the form transformers writes for infinity and NaN
    (``{"__float__": "Infinity"}``); anything else an :class:`UnsupportedConfigError` naming ``where`` it was."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UnsupportedConfigError(f"{where} holds {value!r}, not a number") from None


def mix(mixer: nn.Module, kind: str, h: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
        need_weights: bool = False, **options) -> tuple[Tensor, Tensor | None]:
    """A layer's token mixer on its normed input h (B, L, D): a linear layer takes the key mask of the call's own
    tokens (the last L of ``key_mask``'s S) and carries its state in ``cache``; a softmax layer attends causally
    over its cache and the new tokens at ``positions``, with ``options`` (a window). Returns (output (B, L, D),
    weights or None): with ``need_weights`` a softmax layer's attention weights (B, H, L, S) and a linear layer's
    implicit attention matrix (B, H, L, L), which the inspection tools read alike."""
    attend = called(mixer)  # (its forward where nn.Module.__call__ would add nothing)
    if kind == LINEAR:
        own = None if key_mask is None else key_mask[:, -h.shape[1]:]
        result = attend(h, key_mask=own, cache=cache, need_weights=need_weights)
    else:
        result = attend(h, key_mask=key_mask, is_causal=True, positions=positions, cache=cache,
                        need_weights=need_weights, **options)
    return result.output, result.weights


class HybridLM(nn.Module):
    """The forward of a hybrid decoder: subclasses build ``layers`` (blocks with a ``kind`` and
    ``forward(x, key_mask=, positions=, cache=, need_weights=) -> (x, weights)``), ``norm`` and ``lm_head``, and say how tokens are embedded
    (:meth:`embed`) and what cache a softmax layer keeps (:meth:`softmax_cache`)."""

    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Linear
    logits_scaling: float = 1.0  # the logits are lm_head's divided by it (Granite's muP)

    def embed(self, input_ids: Tensor) -> Tensor:
        raise NotImplementedError

    def softmax_cache(self):
        """A new cache for one softmax layer."""
        return KVCache()

    def new_cache(self) -> list:
        """A cache for each softmax layer (:meth:`softmax_cache`), a constant-size state for each linear one, None
        for a layer without a token mixer (:data:`FEED_FORWARD_ONLY`)."""
        return [LinearStateCache() if block.kind == LINEAR else None if block.kind in FEED_FORWARD_ONLY
                else self.softmax_cache() for block in self.layers]

    @kept.per_call
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, cache: list | None = None,
                position_ids: Tensor | None = None, last_only: bool = False, need_weights: bool = False) -> LMOutput:
        """Logits for input_ids (B, L); ``attention_mask`` (B, S) 1 at real tokens, S = the tokens so far, cached
        and new (each layer reads the columns its cache attends: :func:`.blocks.layer_key_masks`);
        ``position_ids`` (B, L) the new tokens' positions (default: the caches' onwards); ``need_weights``: every
        layer's attention, (B, H, L, S) of a softmax layer and the implicit (B, H, L, L) of a linear one, in the
        output's ``attentions`` (layer by layer, as the model numbers them; None for a layer without a token
        mixer)."""
        check_rank("input_ids", input_ids, 2, "(B, L)")
        B, L = input_ids.shape
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache must hold one cache per layer ({len(self.layers)}), got {len(cache)}")
        key_masks = layer_key_masks(attention_mask, B, L, cache)  # (B, S_i) per layer: a linear layer's own L
        x = self.embed(input_ids)
        # the blocks, the norm and the head without nn.Module.__call__ where it would add nothing (called, normalised)
        attentions: list[Tensor] | None = [] if need_weights else None
        for i, block in enumerate(self.layers):
            key_mask = None if key_masks is None else key_masks[0 if cache is None else i]
            x, weights = called(block)(x, key_mask=key_mask, positions=position_ids,
                                       cache=None if cache is None else cache[i], need_weights=need_weights)
            if attentions is not None:
                attentions.append(weights)
        x = normalised(self._modules["norm"], x)
        logits = project_by_name(self, "lm_head", x[:, -1:] if last_only else x)
        if self.logits_scaling != 1:
            logits = logits / self.logits_scaling
        return LMOutput(logits, x, attentions)
