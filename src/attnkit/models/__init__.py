"""Models composed from the layers: RNN encoder-decoders and Transformers."""

from .blocks import count_parameters
from .config import PRESETS, DecoderConfig, EncoderConfig, Seq2SeqConfig, TransformerConfig, preset
from .decoder import DecoderLM, document_positions, pack_documents, packed_lm_losses
from .encoder import EncoderModel
from .exportable import ExportableDecoderLM
from .outputs import EncoderOutput, LMOutput, StepOutput, TranslationOutput
from .seq2seq import Seq2Seq
from .transformer import TransformerEncoderDecoder

__all__ = [
    "Seq2Seq",
    "Seq2SeqConfig",
    "TransformerEncoderDecoder",
    "TransformerConfig",
    "DecoderLM",
    "ExportableDecoderLM",
    "DecoderConfig",
    "EncoderModel",
    "EncoderConfig",
    "PRESETS",
    "preset",
    "build_model",
    "count_parameters",
    "StepOutput",
    "TranslationOutput",
    "LMOutput",
    "EncoderOutput",
    "pack_documents",
    "document_positions",
    "packed_lm_losses",
]


def build_model(config):
    """The model a config describes (randomly initialised)."""
    if isinstance(config, Seq2SeqConfig):
        return Seq2Seq(config)
    if isinstance(config, TransformerConfig):
        return TransformerEncoderDecoder(config)
    raise TypeError(f"config must be a Seq2SeqConfig or TransformerConfig, got {type(config).__name__}")
