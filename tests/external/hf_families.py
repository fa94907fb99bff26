"""Tiny random models of any transformers family, and the checks that make a family "verified":
the same weights run with attn_implementation="eager" and "attnkit" give equal logits at every
position, attention weights of every row (the pad rows that have no key included) and gradients
(fp32, 1e-4) with left padding in the batch and, for decoders, the language-model loss whose first
real label is predicted from a pad position; the same greedy ids with the dynamic and the static
cache; and attnkit's attention is called in every compared forward and generation (a family that
never reaches it verifies nothing). Used by tests/external/test_hf_families.py and by
``python tests/external/hf_families.py`` (the walk over transformers' registry that produced
``attnkit.hf.VERIFIED_FAMILIES``)."""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings

import torch

ATOL = 1e-4
VOCAB = 99
# Size keys set where a config class has them (aliases resolve through each class's attribute_map).
TINY = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=64, max_position_embeddings=64, head_dim=8, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, d_kv=8, d_ff=64,
    num_layers=2, num_decoder_layers=2, num_heads=4, ffn_dim=64, num_local_experts=4, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16, n_routed_experts=4,
    n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
    qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1, max_window_layers=1, global_attn_every_n_layers=2,
    local_attention=8, attention_chunk_size=8, embedding_size=32, num_memory_tokens=0,
    # sparse attention small enough to select: 4 of the 13 tokens (DeepSeek-V3.2's DSA and its kin),
    # 2 blocks of 2 keys (MiniMax-M3), so that a selection attnkit ignored would show
    index_topk=4, index_n_heads=2, index_head_dim=8, index_block_size=2, index_topk_blocks=2,
)
# Per family, sizes over TINY: hybrids whose two tiny layers would otherwise all be linear attention (the walk
# needs a softmax layer to compare), and linear or state-space layers of their own small widths.
FAMILY_SIZES = {
    family: {"layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8}
    for family in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
} | {
    "kimi_linear": {"layer_types": ["linear_attention", "full_attention"], "mlp_layer_types": ["dense", "sparse"],
                    "linear_head_dim": 8, "linear_num_heads": 4},
    "bailing_hybrid": {"layer_types": ["linear_attention", "full_attention"], "linear_head_dim": 8,
                       "linear_num_heads": 4, "layer_group_size": 2},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_dt_rank": 8, "use_mamba_kernels": False},
    "bamba": {"attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8,
              "mamba_chunk_size": 8},
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"], "mamba_n_heads": 4, "mamba_d_head": 16,
                         "mamba_d_state": 8, "mamba_chunk_size": 8},
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8,
                  "mamba_chunk_size": 8},  # its defaults (a state of 256, chunks of 256) took 11 s a walk in float64
    "nemotron_h": {"ssm_state_size": 8, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "chunk_size": 8},
}
KINDS = ("decoder", "seq2seq", "encoder")
_WEIGHTS = {"decoder": ("attentions",), "encoder": ("attentions",),
            "seq2seq": ("encoder_attentions", "decoder_attentions", "cross_attentions")}
"""The attention weights a model's output holds, by kind of model (:data:`KINDS`)."""
MAX_PARAMETERS = 3_000_000


def model_class(family: str):
    """(transformers model class, kind) for a family with a text head, or (None, reason)."""
    import transformers
    from transformers.models.auto import modeling_auto as ma

    for mapping, kind in ((ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "seq2seq"),
                          (ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "encoder"),
                          (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "decoder")):
        name = mapping.get(family)
        if isinstance(name, (tuple, list)):
            name = name[0]
        if name and hasattr(transformers, name):
            return getattr(transformers, name), kind
    return None, "no causal-LM, seq2seq or masked-LM class"


def tiny_config(family: str, **sizes):
    """The family's config class with its size keys shrunk (TINY, with ``sizes`` over it; a sliding
    window of 5 where the family has one); token ids moved inside the vocabulary."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    default = cls()
    sizes = FAMILY_SIZES.get(family, {}) | sizes
    keys = {k: v for k, v in (TINY | sizes).items() if hasattr(default, k)}
    if getattr(default, "kv_lora_rank", None) is not None:  # latent attention (MLA): every head reads the latent,
        keys["num_key_value_heads"] = keys.get("num_attention_heads", default.num_attention_heads)  # and head_dim
        if "head_dim" in keys:  # is the rotary part of a head (DeepSeek-V3's config sets it so)
            keys["head_dim"] = keys.get("qk_rope_head_dim", default.qk_rope_head_dim)
    if getattr(default, "sliding_window", None):
        keys["sliding_window"] = 5
    for name, value in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 1)):
        current = getattr(default, name, None)
        if (current is not None and (not isinstance(current, int) or current >= VOCAB)) or (
                current is None and name == "decoder_start_token_id" and hasattr(default, name)):
            keys[name] = value
    if getattr(default, "layer_types", None) is not None and "layer_types" not in sizes:
        keys["layer_types"] = None  # recomputed from the new layer count
    if getattr(default, "tie_word_embeddings", None) is not None:
        keys["tie_word_embeddings"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls(**keys)
        except Exception:
            keys.pop("layer_types", None)
            return cls(**keys)


def layer_type_variants(family: str) -> list[str]:
    """The attention layer types the family's modeling code tells apart (string literals it compares a
    ``layer_types`` entry with, and its default config's entries, within transformers' attention layer
    types) that its tiny config does not build: each is walked in a variant of its own."""
    import importlib
    import inspect
    import re

    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    try:
        source = inspect.getsource(importlib.import_module(cls.__module__.replace("configuration_", "modeling_")))
    except (ImportError, OSError):
        source = ""
    named = set(re.findall(r'layer_types?(?:\[[^\]]*\])?\s*(?:==|!=)\s*"(\w+)"', source))
    for group in re.findall(r'layer_types?(?:\[[^\]]*\])?\s+(?:not\s+)?in\s*[(\[{]([^)\]}]*)', source):
        named.update(re.findall(r'"(\w+)"', group))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        named.update(getattr(cls(), "layer_types", None) or [])
        built = set(getattr(tiny_config(family), "layer_types", None) or [])
    return sorted((named & set(ALLOWED_ATTN_LAYER_TYPES)) - built)


def pair(family: str, layer_type: str | None = None):
    """(eager model, attnkit model, kind) with equal random weights, or raises; ``layer_type``: the first
    layer of that attention type (:func:`layer_type_variants`)."""
    import attnkit.hf

    config = tiny_config(family)
    if layer_type is not None:
        types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
        window = {"sliding_window": 5, "use_sliding_window": True} if layer_type == "sliding_attention" else {}
        config = tiny_config(family, layer_types=[layer_type, *types[1:]], **window)
        if list(config.layer_types)[0] != layer_type:
            raise ValueError(f"the config does not keep layer_types[0] = {layer_type!r}")
    cls, kind = model_class(family)
    if kind == "seq2seq" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    with torch.device("meta"), warnings.catch_warnings():  # count before allocating: some configs stay large
        warnings.simplefilter("ignore")
        size = sum(p.numel() for p in cls._from_config(copy.deepcopy(config), attn_implementation="eager").parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"the tiny config still has {size:,} parameters")
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = cls._from_config(copy.deepcopy(config), attn_implementation=implementation,
                                         experts_implementation="eager")
            except TypeError:
                model = cls._from_config(copy.deepcopy(config), attn_implementation=implementation)
            models.append(model.eval())
    eager, ours = models
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in eager.parameters():
            if p.is_floating_point():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
    ours.load_state_dict(eager.state_dict())
    return eager, ours, kind


def inputs(kind: str, generator: torch.Generator) -> dict:
    ids = torch.randint(3, VOCAB, (2, 13), generator=generator)
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    batch = {"input_ids": ids, "attention_mask": mask}
    if kind == "seq2seq":
        batch["decoder_input_ids"] = torch.randint(3, VOCAB, (2, 7), generator=generator)
    return batch


def _max_difference(a, b, keep=None) -> float:
    """The largest absolute difference, in float32 (float64 for float64 tensors: a float32 copy would round it)."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    difference = (a.to(dtype) - b.to(dtype)).abs()
    if keep is not None:
        difference = difference[keep]
    return float(difference.max()) if difference.numel() else 0.0


@contextlib.contextmanager
def counting_calls():
    """A one-element list counting the calls of attnkit's attention from the bridge meanwhile."""
    import attnkit.hf.interface as interface

    real = interface.attention
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    interface.attention = counted
    try:
        yield calls
    finally:
        interface.attention = real


def check(family: str) -> list[str]:
    """Every difference between eager and attnkit for a family (empty: verified): its tiny config, then a
    variant per attention layer type that config does not build (:func:`layer_type_variants`)."""
    problems = _check_pair(*pair(family))
    for layer_type in layer_type_variants(family):
        eager, ours, kind = pair(family, layer_type)
        try:
            with torch.no_grad():
                eager(**inputs(kind, torch.Generator().manual_seed(11)))
        except Exception as error:  # noqa: BLE001 - a variant eager itself cannot run is outside the walk
            UNRUNNABLE[(family, layer_type)] = f"{type(error).__name__}: {str(error)[:120]}"
            continue
        problems += [f"[{layer_type} layer] {p}" for p in _check_pair(eager, ours, kind)]
    return problems


UNRUNNABLE: dict[tuple[str, str], str] = {}
"""(family, layer type) -> why eager itself failed on that variant (it is outside the walk)."""


def _differences(theirs, mine, their_grads: dict, my_grads: dict, kind: str, atol: float, *, weighted=None,
                 where: str = "") -> list[str]:
    """Every difference above ``atol`` between eager's outputs and attnkit's (``theirs``, ``mine``: logits, loss),
    their attention weights (those of ``weighted``, a pair of outputs that hold them, else of ``theirs`` and
    ``mine``) and their parameters' gradients (relative to each gradient's largest entry); ``where`` prefixes each."""
    problems = []
    if (d := _max_difference(theirs.logits, mine.logits)) > atol:
        problems.append(f"{where}logits differ by {d:.3g}")
    if getattr(theirs, "loss", None) is not None and (d := _max_difference(theirs.loss, mine.loss)) > atol:
        problems.append(f"{where}loss differs by {d:.3g}")
    their_weights, my_weights = weighted or (theirs, mine)
    for what in _WEIGHTS[kind]:
        a_all, b_all = getattr(their_weights, what, None), getattr(my_weights, what, None)
        if not a_all and not b_all:
            continue
        if not a_all or not b_all or len(a_all) != len(b_all):
            problems.append(f"{where}{what}: {len(b_all or ())} layers, eager {len(a_all or ())}")
            continue
        for layer, (a, b) in enumerate(zip(a_all, b_all)):
            if a is None or b is None or a.shape != b.shape:
                problems.append(f"{where}{what}[{layer}] shape {None if b is None else tuple(b.shape)} vs "
                                f"{None if a is None else tuple(a.shape)}")
                break
            if (d := _max_difference(a, b)) > atol:
                problems.append(f"{where}{what}[{layer}] differ by {d:.3g}")
                break
    if set(their_grads) != set(my_grads):
        problems.append(f"{where}different parameters received gradients")
    for name, g in their_grads.items():
        scale = max(1.0, float(g.abs().max())) if g.numel() else 1.0
        if name in my_grads and (d := _max_difference(g, my_grads[name])) > atol * scale:
            problems.append(f"{where}gradient of {name} differs by {d:.3g}")
            break
    return problems


def _check_pair(eager, ours, kind: str) -> list[str]:
    """Every difference between the eager and the attnkit model of one config."""
    generator = torch.Generator().manual_seed(11)
    batch = inputs(kind, generator)
    if kind == "decoder":  # pads ignored, so the last pad position predicts the first real token
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    problems = []
    outputs = []
    for model in (eager, ours):
        model.zero_grad()
        with counting_calls() as calls:
            out = model(**batch, output_attentions=True)
        if model is ours and calls[0] == 0:
            problems.append("attnkit's attention was never called in the forward")
        weights = torch.randn(out.logits.shape, generator=torch.Generator().manual_seed(3))
        loss = (out.logits * weights).sum()
        if getattr(out, "loss", None) is not None:
            loss = loss + out.loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs.append((out, grads))
    (theirs, their_grads), (mine, my_grads) = outputs
    problems += _differences(theirs, mine, their_grads, my_grads, kind, ATOL)
    if kind in ("decoder", "seq2seq"):
        generate = {k: v for k, v in batch.items() if k not in ("decoder_input_ids", "labels")}
        for cache in (None, "static"):
            options = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
            if cache:
                options["cache_implementation"] = cache
            ids = []
            for model in (eager, ours):
                with torch.no_grad(), warnings.catch_warnings(), counting_calls() as calls:
                    warnings.simplefilter("ignore")
                    try:
                        ids.append(model.generate(**generate, **options))
                    except Exception as error:  # noqa: BLE001 - eager's own failure puts the mode outside the walk
                        if model is ours:
                            raise
                        UNRUNNABLE[(eager.config.model_type, f"generate, {cache or 'dynamic'} cache")] = str(error)[:120]
                        break
                if model is ours and calls[0] == 0:
                    problems.append(f"attnkit's attention was never called in generation with the {cache or 'dynamic'} cache")
            if len(ids) == 2 and not torch.equal(*ids):
                problems.append(f"greedy ids differ with the {cache or 'dynamic'} cache")
    return problems


FLOAT64_ATOL = 1e-12
"""Float64 against eager: logits, loss, attention weights and gradients (relative to each gradient's largest entry).
Measured over the verified families: 1.4e-14 at most (the T5 family's logits), most below 2e-15."""


def check_float64(family: str) -> list[str]:
    """Every difference above :data:`FLOAT64_ATOL` between eager and attnkit for a family in float64, with the steps
    transformers rounds to float32 whatever the model's dtype (eager's softmax, norms, rotary angles) kept in float64
    (:mod:`float64_checks`): logits, loss and gradients of a left-padded batch (attnkit's fused path), then every
    attention weight of a forward that asks for them (its weights' path), on its tiny config and each attention
    layer type's variant that eager can run."""
    from float64_checks import float64_copy, float64_inside

    problems = []
    for layer_type in (None, *layer_type_variants(family)):
        eager, ours, kind = pair(family, layer_type)
        batch = inputs(kind, torch.Generator().manual_seed(11))
        if kind == "decoder":
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        results, weighted = [], []
        with float64_inside():
            for model in (float64_copy(eager), float64_copy(ours)):
                with counting_calls() as calls:
                    try:
                        out = model(**batch)
                    except Exception as error:  # noqa: BLE001 - a variant eager cannot run is outside the walk
                        if model.config._attn_implementation != "eager" or layer_type is None:
                            raise
                        UNRUNNABLE[(family, layer_type)] = f"{type(error).__name__}: {str(error)[:120]}"
                        break
                if model.config._attn_implementation != "eager" and calls[0] == 0:
                    problems.append(f"attnkit's attention was never called ({layer_type or 'tiny config'})")
                direction = torch.randn(out.logits.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
                loss = (out.logits * direction).sum() + (out.loss if getattr(out, "loss", None) is not None else 0)
                loss.backward()
                results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
                with torch.no_grad():  # the weights' own path (attnkit returns exact weights beside its output)
                    weighted.append(model(**{k: v for k, v in batch.items() if k != "labels"}, output_attentions=True))
        if len(results) < 2:
            continue
        (theirs, their_grads), (mine, my_grads) = results
        where = f"float64, [{layer_type} layer] " if layer_type else "float64, "
        problems += _differences(theirs, mine, their_grads, my_grads, kind, FLOAT64_ATOL, weighted=weighted,
                                 where=where)
    return problems


def walk(families=None) -> dict[str, str]:
    """family -> "pass", "DIFF: ..." or "cannot build: ..." over transformers' registry."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    import attnkit.hf

    attnkit.hf.register(allow_unverified=list(CONFIG_MAPPING_NAMES))
    results = {}
    for family in families or sorted(CONFIG_MAPPING_NAMES):
        cls, kind = model_class(family)
        if cls is None:
            results[family] = f"no text model: {kind}"
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                problems = check(family)
        except Exception as error:  # noqa: BLE001 - a walk reports every family's outcome
            results[family] = f"error: {type(error).__name__}: {str(error)[:160]}"
        else:
            results[family] = "pass" if not problems else "DIFF: " + "; ".join(problems)
        print(f"{family}\t{results[family]}", flush=True)
    return results


if __name__ == "__main__":
    walk(sys.argv[1:] or None)
