"""Inspecting attention: what heads do, how far tokens reach, whether attention agrees with
gradient attribution, and how good the alignments it learns are.

- :mod:`~attnkit.inspect.roles`: head roles after Clark et al. 2019 (previous / next token, [CLS],
  [SEP], punctuation, self) and attention entropy;
- :mod:`~attnkit.inspect.rollout`: attention rollout and attention flow (Abnar & Zuidema 2020);
- :mod:`~attnkit.inspect.attribution`: integrated gradients, gradient x input, Spearman and Kendall;
- :mod:`~attnkit.inspect.agreement`: attention vs attribution per example, on an encoder or a seq2seq model;
- :mod:`~attnkit.inspect.alignment`: AER, IBM Model 1, eflomal and symmetrisation, the diagonal
  baseline, alignments from attention (any layer / head, shift-att);
- :mod:`~attnkit.inspect.report`: the files ``attnkit inspect`` writes (PNGs, HTML viewer, markdown).
"""

from .agreement import Agreement, encoder_agreement, seq2seq_agreement, summarise
from .alignment import (
    SYMMETRIZATIONS,
    AlignmentScores,
    IBMModel1,
    alignment_error_rate,
    attention_word_weights,
    cross_attention_pieces,
    diagonal_alignment,
    eflomal_align,
    links_from_weights,
    select_weights,
    symmetrize,
    word_weights,
)
from .attribution import gradient_x_input, integrated_gradients, kendall, spearman
from .record import record_attention
from .roles import ROLES, SENTENCES, HeadRoles, encoder_attentions, entropy, head_roles
from .rollout import attention_flow, attention_rollout, residual_attention

__all__ = [
    "ROLES",
    "SENTENCES",
    "HeadRoles",
    "head_roles",
    "entropy",
    "encoder_attentions",
    "attention_rollout",
    "attention_flow",
    "residual_attention",
    "integrated_gradients",
    "gradient_x_input",
    "spearman",
    "kendall",
    "Agreement",
    "encoder_agreement",
    "seq2seq_agreement",
    "summarise",
    "AlignmentScores",
    "alignment_error_rate",
    "diagonal_alignment",
    "links_from_weights",
    "word_weights",
    "attention_word_weights",
    "cross_attention_pieces",
    "select_weights",
    "symmetrize",
    "SYMMETRIZATIONS",
    "eflomal_align",
    "IBMModel1",
    "record_attention",
]
