"""Every keyword transformers' models hand their attention function, and what attnkit makes of it.

transformers calls ``attention_interface(module, query, key, value, attention_mask, dropout=,
scaling=, **kwargs)``; the keywords beyond those differ by family and by the implementation asked
for (a family may pass a sparse selection only to implementations other than eager and sdpa). A
keyword attnkit ignored would silently change the numbers (hy_v4's top-k ``indices`` did: every
query saw every key), so each keyword is one of three kinds, and any other is refused by name:

- :data:`APPLIED`: attnkit computes with it;
- :data:`IGNORED`: eager ignores it too, or it says nothing about the attention's numbers; ignoring
  it gives eager's numbers;
- :data:`REFUSED`: it means something eager does not do, which attnkit does not do either.

The table was made by a static audit of every ``attention_interface(...)`` call in transformers'
modeling files and a record of the keywords the verified families' walk passed
(tests/external/test_hf_keywords.py keeps both).
"""

from __future__ import annotations

from .families import UnsupportedFeature

__all__ = ["APPLIED", "IGNORED", "REFUSED", "check_keywords"]

APPLIED: dict[str, str] = {
    "position_bias": "T5's relative position bias, added to the scores",
    "softcap": "Gemma 2's logit softcapping, a score_mod",
    "s_aux": "gpt-oss's learned sinks",
    "sinks": "learned sinks (another family's name for s_aux)",
    "indices": "DeepSeek sparse attention's top-k keys per query (B, L, k): a mask of the selected keys",
    "block_indices": "MiniMax-M3's top-k key blocks per query and key head (B, Hkv, L, k): a mask of the selected blocks",
    "output_attentions": "return the attention weights",
}
IGNORED: dict[str, str] = {
    "sliding_window": "the window is in the mask transformers asks attnkit's mask function for (eager reads it there too)",
    "position_ids": "positions are in the queries and keys already; packed sequences are in the mask transformers builds",
    "use_cache": "the cache is the model's; attention sees its keys",
    "cache": "the cache is the model's; attention sees its keys",
    "past_key_values": "the cache is the model's; attention sees its keys",
    "cache_position": "positions are in the queries and keys already",
    "output_hidden_states": "a model output, not an attention input",
    "output_router_logits": "a model output, not an attention input",
    "return_dict": "a model output's form",
    "encoder_hidden_states": "a cross-attention module receives them as its key and value",
    "num_items_in_batch": "the loss's normaliser",
    "shift_labels": "the loss's labels, already shifted (context parallelism hands them to the model)",
    "deterministic": "flash-attention's backward option; attnkit's kernels choose no order at random",
    "layer_idx": "the cache's index of the layer",
}
REFUSED: dict[str, str] = {
    "cu_seq_lens_q": "packed sequences in flash-attention's varlen form, which eager ignores (its queries would attend "
                     "across the packed documents): describe the packing with position_ids, from which transformers "
                     "builds the block-diagonal mask",
    "cu_seq_lens_k": "packed sequences in flash-attention's varlen form (see cu_seq_lens_q)",
    "max_length_q": "packed sequences in flash-attention's varlen form (see cu_seq_lens_q)",
    "max_length_k": "packed sequences in flash-attention's varlen form (see cu_seq_lens_q)",
    "seq_idx": "packed sequences as sequence indices, which eager ignores (see cu_seq_lens_q)",
}


_KNOWN = frozenset(APPLIED) | frozenset(IGNORED)


def check_keywords(owner: str, kwargs: dict) -> None:
    """Raise :class:`UnsupportedFeature` for a keyword attnkit refuses, or one it does not know, naming it. (Every
    layer call runs it: keywords all applied or ignored, the common case, are settled by one set comparison.)"""
    if kwargs.keys() <= _KNOWN:
        return
    for name, value in kwargs.items():
        if name in APPLIED or name in IGNORED:
            continue
        if name in REFUSED:
            if value is None:
                continue
            raise UnsupportedFeature(f"{owner}: attention was given {name}=: {REFUSED[name]}")
        raise UnsupportedFeature(
            f"{owner}: attention was given the keyword {name}=, which attnkit does not know: it refuses it rather than "
            f"ignore it and risk other numbers than eager's (known: {', '.join(sorted([*APPLIED, *IGNORED]))})")
