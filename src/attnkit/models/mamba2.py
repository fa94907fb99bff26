"""Mamba-2 as an attnkit decoder (Dao and Gu 2024): every layer a Mamba-2 mixer, a pre-norm residual around each.

    x = embed(ids);   for each layer: x = x + Mamba2(RMSNorm(x));   logits = lm_head(RMSNorm(x))

Module names follow transformers' ``Mamba2ForCausalLM`` without its ``backbone.`` prefix (``embeddings``,
``layers.i.norm``, ``layers.i.mixer``; attnkit's ``norm`` for its ``norm_f``). The cache is one constant-size
:class:`~attnkit.layers.LinearStateCache` a layer. :func:`load_checkpoint_folder` (reached through
:func:`attnkit.models.pretrained.load_hf_folder`) reads a transformers checkpoint folder.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional.precision import accumulation_dtype
from ..layers import Mamba2
from ..layers.mamba2 import SSD_CHUNK
from .blocks import normalised
from .config_values import FLAG, NAME, NAMES, NON_NEGATIVE, SIZE, STEP_LIMIT, nullable
from .hf_config import UnsupportedConfigError
from .hybrid import HARMLESS, LINEAR, HybridLM, checked_keys, json_float, mix
from .weights import load_native_folder

__all__ = ["dt_limit_from_hf", "mamba_heads_from_hf", "Mamba2Config", "Mamba2LM", "mamba2_config_from_hf", "load_checkpoint_folder"]


@dataclass(frozen=True)
class Mamba2Config:
    """The sizes of a Mamba-2 model (transformers' ``Mamba2Config`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int = 1
    conv_kernel: int = 4
    conv_bias: bool = True
    bias: bool = False
    norm_eps: float = 1e-5
    chunk_size: int = SSD_CHUNK
    dt_limit: tuple[float, float] = (0.0, math.inf)
    residual_in_fp32: bool = True  # the residual stream in float32 for half types (float64 stays float64)
    tie_embeddings: bool = False
    max_len: float = math.inf  # generation's bound: none, its state is of one size whatever the length


class Mamba2Block(nn.Module):
    """x + Mamba2(RMSNorm(x)): transformers' ``Mamba2Block``."""

    kind = LINEAR

    def __init__(self, c: Mamba2Config):
        super().__init__()
        self.residual_in_fp32 = c.residual_in_fp32
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mixer = Mamba2(c.d_model, c.num_heads, c.head_dim, c.state_size, n_groups=c.n_groups,
                            conv_kernel=c.conv_kernel, conv_bias=c.conv_bias, bias=c.bias, norm_eps=c.norm_eps,
                            chunk_size=c.chunk_size, dt_limit=c.dt_limit)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        residual = x.to(accumulation_dtype(x.dtype)) if self.residual_in_fp32 else x
        mixed, weights = mix(self.mixer, LINEAR, normalised(self._modules["norm"], x), key_mask=key_mask,
                             positions=positions, cache=cache, need_weights=need_weights)
        return (residual + mixed).to(x.dtype), weights


class Mamba2LM(HybridLM):
    """Mamba-2's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, need_weights=)`` ->
    :class:`~attnkit.models.outputs.LMOutput` as attnkit's other decoders (:class:`~attnkit.models.hybrid.HybridLM`),
    so :func:`attnkit.decoding.generate` drives it; ``need_weights`` gives every layer's implicit attention."""

    def __init__(self, config: Mamba2Config):
        super().__init__()
        c = self.config = config
        self.embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Mamba2Block(c) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embeddings.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embeddings(input_ids)


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE, "num_heads": SIZE, "head_dim": SIZE,
         "state_size": SIZE, "n_groups": SIZE, "expand": SIZE, "conv_kernel": SIZE, "use_conv_bias": FLAG,
         "use_bias": FLAG, "layer_norm_epsilon": NON_NEGATIVE, "time_step_limit": nullable(STEP_LIMIT),
         "residual_in_fp32": FLAG, "tie_word_embeddings": nullable(FLAG), "hidden_act": NAME, "model_type": NAME,
         "layer_types": nullable(NAMES)}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`)."""
_HARMLESS = HARMLESS | {"time_step_rank", "time_step_min", "time_step_max", "time_step_floor", "rescale_prenorm_residual",
                        "num_labels", "max_position_embeddings",
                        "chunk_size"}  # (a kernel's tile: attnkit scans by SSD_CHUNK, the same numbers to rounding)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size")


def dt_limit_from_hf(hf: dict, kind: str) -> tuple[float, float]:
    """A Mamba-2 config's ``time_step_limit`` as (low, high): absent or null is no limit, (0, inf); anything but two
    numbers is refused by name. The limit of every family that keeps the key (Mamba-2, Bamba, Granite 4.0-H,
    Falcon-H1)."""
    limit = hf.get("time_step_limit") or (0.0, math.inf)
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise UnsupportedConfigError(f"{kind} config: time_step_limit must be [low, high], got {limit!r}")
    low, high = (json_float(bound, f"{kind} config: time_step_limit") for bound in limit)
    if not 0 <= low <= high:
        raise UnsupportedConfigError(f"{kind} config: time_step_limit must be [low, high] with 0 <= low <= high, got "
                                     f"{list(limit)!r}")
    return low, high


def mamba_heads_from_hf(hf: dict, kind: str, inner: int, width: str) -> tuple[int, int]:
    """(heads, head width) from a hybrid's ``mamba_n_heads`` and ``mamba_d_head`` (``"auto"`` or absent: the
    mixer's width ``inner`` over the heads), refused by name unless heads x head width is ``inner``; ``width`` says
    where ``inner`` comes from (Bamba, Granite 4.0-H, Falcon-H1)."""
    heads = hf.get("mamba_n_heads", 128)
    head_dim = hf.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):
        head_dim = inner // heads
    if heads * head_dim != inner:
        raise UnsupportedConfigError(f"{kind} config: mamba_n_heads x mamba_d_head = {heads} x {head_dim} must equal "
                                     f"{width}")
    return heads, head_dim


def mamba2_config_from_hf(hf: dict) -> Mamba2Config:
    """attnkit's config from a transformers Mamba-2 ``config.json``: every key read, harmless in evaluation, or
    refused by name (:class:`UnsupportedConfigError`). ``time_step_rank`` is an initialisation size Mamba-2 does not
    use (its step is one projection a head); the other ``time_step_*`` keys only initialise ``dt_bias``."""
    checked_keys(hf, ("mamba2",), _READ, _HARMLESS, _REQUIRED)
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"mamba2 config: attnkit implements hidden_act 'silu', got {hf['hidden_act']!r}")
    heads, head_dim, d_model = hf["num_heads"], hf["head_dim"], hf["hidden_size"]
    inner = int(hf.get("expand", 2) * d_model)
    if heads * head_dim != inner:
        raise UnsupportedConfigError(f"mamba2 config: num_heads x head_dim = {heads} x {head_dim} must equal expand x "
                                     f"hidden_size = {inner} (the mixer's width)")
    types = hf.get("layer_types")
    if types is not None and set(types) - {"mamba"}:
        raise UnsupportedConfigError(f"mamba2 config: layer_types other than 'mamba' are not Mamba-2's, got "
                                     f"{sorted(set(types))}")
    return Mamba2Config(
        vocab_size=hf["vocab_size"], d_model=d_model, num_layers=hf["num_hidden_layers"], num_heads=heads,
        head_dim=head_dim, state_size=hf["state_size"], n_groups=hf.get("n_groups", 1),
        conv_kernel=hf.get("conv_kernel", 4), conv_bias=bool(hf.get("use_conv_bias", True)),
        bias=bool(hf.get("use_bias", False)), norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        chunk_size=SSD_CHUNK, dt_limit=dt_limit_from_hf(hf, "mamba2"),
        residual_in_fp32=bool(hf.get("residual_in_fp32", True)), tie_embeddings=bool(hf.get("tie_word_embeddings")))


def _attnkit_name(name: str) -> str:
    name = name.removeprefix("backbone.")
    return "norm.weight" if name == "norm_f.weight" else name


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> Mamba2LM:
    """A :class:`Mamba2LM` from a transformers Mamba-2 checkpoint folder (``config.json`` and safetensors), in eval
    mode; every tensor must find its place and every parameter a tensor. Loading never runs code."""
    return load_native_folder(folder, config_from_hf=mamba2_config_from_hf, build=Mamba2LM, dtype=dtype,
                              embedding=("backbone.embeddings.weight",),
                              state=lambda tensors, _: {_attnkit_name(n): t for n, t in tensors.items()})
