"""Layers: ``nn.Module``s that own parameters and call the functional core."""

from .additive import BahdanauAttention
from .attending import PLAIN, Attending, AttentionCall, Cache
from .cache import FixedKVCache, KVCache, SinkCache
from .delta import GatedDeltaNet, GatedRMSNorm, KimiDeltaAttention, LightningAttention, LinearStateCache
from .efficient import LinearAttention, LinformerAttention, PerformerAttention
from .gated import DifferentialAttention, GatedAttention
from .indexer import LightningIndexer
from .latent import LatentAttention, LatentCache
from .mamba2 import GroupedGatedRMSNorm, Mamba2
from .multihead import MultiHeadAttention
from .multiplicative import LuongAttention
from .positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    sinusoidal_table,
)
from .self_attention import SelfAttention
from .sparse import LongformerSelfAttention
from .torch_mha import TorchMultiheadAttention, from_torch_mha, to_torch_mha

__all__ = [
    "BahdanauAttention",
    "LuongAttention",
    "SelfAttention",
    "MultiHeadAttention",
    "TorchMultiheadAttention",
    "from_torch_mha",
    "to_torch_mha",
    "GatedAttention",
    "DifferentialAttention",
    "LatentAttention",
    "LatentCache",
    "LightningIndexer",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "LightningAttention",
    "GatedRMSNorm",
    "LinearStateCache",
    "AttentionCall",
    "Attending",
    "Cache",
    "PLAIN",
    "KVCache",
    "FixedKVCache",
    "SinkCache",
    "LinearAttention",
    "PerformerAttention",
    "LinformerAttention",
    "LongformerSelfAttention",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "ALiBi",
    "sinusoidal_table",
    "apply_rotary",
    "alibi_slopes",
    "alibi_bias", "Mamba2", "GroupedGatedRMSNorm"]
