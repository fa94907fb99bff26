"""Every keyword transformers hands its attention function is applied, ignored as eager ignores it, or
refused by name (attnkit.hf.keywords); sparse selections (DeepSeek-V3.2-style top-k ``indices``,
MiniMax-M3's ``block_indices``) are applied exactly, equal to eager, which folds them into its mask."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.hf import UnsupportedFeature  # noqa: E402
from attnkit.hf.keywords import APPLIED, IGNORED, REFUSED  # noqa: E402
from attnkit.hf.masks import MASK_READING_FAMILIES, StructuredMask  # noqa: E402

from hf_families import check, layer_type_variants, tiny_config  # noqa: E402

SIGNATURE = {"query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal"}


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()


def _attention_keywords() -> dict[str, set[str]]:
    """keyword -> the transformers families whose modeling code passes it to its attention function."""
    root = Path(transformers.__file__).parent / "models"
    found: dict[str, set[str]] = {}
    for path in root.glob("*/modeling_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None) or ""
                if "attention_interface" in name or name in ("attn_fn", "attention_fn", "attn_interface"):
                    for keyword in node.keywords:
                        if keyword.arg:
                            found.setdefault(keyword.arg, set()).add(path.parent.name)
    return found


@pytest.mark.slow
def test_every_keyword_transformers_passes_to_attention_is_classified():
    """A static audit of every attention call in transformers' modeling files: a keyword a new release
    adds fails here, before attnkit could ignore it."""
    found = _attention_keywords()
    assert {"scaling", "dropout", "indices", "block_indices", "softcap", "s_aux"} <= set(found)
    unknown = {k: sorted(v)[:4] for k, v in found.items() if k not in SIGNATURE | set(APPLIED) | set(IGNORED) | set(REFUSED)}
    assert not unknown, f"keywords attnkit has not classified: {unknown}"
    assert not set(APPLIED) & set(IGNORED) and not set(APPLIED) & set(REFUSED) and not set(IGNORED) & set(REFUSED)


def test_every_keyword_a_model_call_passes_through_is_classified():
    """transformers' models hand their **kwargs (TransformersKwargs, FlashAttentionKwargs) down to the attention
    function: each key a user may give a model is classified too (shift_labels reaches it from a loss)."""
    from transformers.modeling_flash_attention_utils import FlashAttentionKwargs
    from transformers.utils.generic import TransformersKwargs

    keys = set(TransformersKwargs.__annotations__) | set(FlashAttentionKwargs.__annotations__) | {"shift_labels"}
    unknown = keys - SIGNATURE - set(APPLIED) - set(IGNORED) - set(REFUSED)
    assert not unknown, f"model keywords attnkit has not classified: {sorted(unknown)}"


def test_the_families_whose_modules_read_the_mask_are_those_that_index_it():
    """A module that scores keys against attention_mask[:, 0] (DSA's indexer) needs the whole mask; such
    families get transformers' own mask from attnkit's mask function (MASK_READING_FAMILIES)."""
    root = Path(transformers.__file__).parent / "models"
    readers = set()
    for path in root.glob("*/modeling_*.py"):
        source = path.read_text(encoding="utf-8")
        if "indexer" in source and "attention_mask[:, 0" in source:
            readers.add(path.parent.name)
    assert readers <= MASK_READING_FAMILIES, readers - MASK_READING_FAMILIES
    assert "hy_v4" in readers


class _Module(torch.nn.Module):
    config = transformers.LlamaConfig()
    is_causal = True


@pytest.mark.parametrize(("keyword", "value", "message"), [
    ("some_new_option", 1, r"the keyword some_new_option=, which attnkit does not know"),
    ("cu_seq_lens_q", torch.tensor([0, 3]), r"cu_seq_lens_q=: packed sequences in flash-attention's varlen form"),
    ("seq_idx", torch.zeros(1, 3, dtype=torch.int32), r"seq_idx=: packed sequences as sequence indices"),
])
def test_unknown_and_refused_keywords_are_named(keyword, value, message):
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(UnsupportedFeature, match=message):
        attnkit.hf.attnkit_attention_forward(_Module(), q, q, q, None, **{keyword: value})


def test_ignored_keywords_change_nothing_and_none_refused_ones_pass():
    q = torch.randn(1, 2, 3, 8)
    plain, _ = attnkit.hf.attnkit_attention_forward(_Module(), q, q, q, None)
    ignored, _ = attnkit.hf.attnkit_attention_forward(_Module(), q, q, q, None, use_cache=True, position_ids=None,
                                                      sliding_window=None, cu_seq_lens_q=None, deterministic=True)
    assert torch.equal(plain, ignored)


def test_a_selection_computed_from_the_structured_mask_is_refused():
    """Indices an indexer computed against attnkit's (B, 1, 1, S) structured mask carry its type: the
    model read the mask itself, and its selection is not eager's."""
    q = torch.randn(1, 2, 3, 8)
    derived = torch.zeros(1, 3, 2, dtype=torch.int32).as_subclass(StructuredMask)
    with pytest.raises(UnsupportedFeature, match=r"indices were computed from attnkit's structured mask"):
        attnkit.hf.attnkit_attention_forward(_Module(), q, q, q, None, indices=derived)


@pytest.mark.parametrize(("family", "sizes"), [
    ("hy_v4", dict(index_topk=4)),
    ("minimax_m3_vl_text", dict(index_topk_blocks=2, index_block_size=2)),
])
def test_sparse_selections_equal_eager_which_folds_them_into_its_mask(family, sizes, monkeypatch):
    """hy_v4 passed its indexer's top-k as indices= to attnkit, which ignored it (logits 0.32 off with 4 of
    12 tokens); minimax_m3_vl_text its key blocks as block_indices= (its sparse layers, "minimax_m3_sparse",
    which the walk never built). Now both equal eager: logits, weights, loss, gradients, greedy ids."""
    import hf_families

    monkeypatch.setattr(hf_families, "TINY", hf_families.TINY | sizes)
    assert tiny_config(family).to_dict().items() >= sizes.items()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert check(family) == []
    if family == "minimax_m3_vl_text":
        assert layer_type_variants(family) == ["minimax_m3_sparse"]


def test_the_walk_builds_every_attention_layer_type_a_family_tells_apart():
    assert "sliding_attention" in layer_type_variants("qwen2")  # off in its default config
    assert layer_type_variants("llama") == []


def test_a_selection_joins_a_users_additive_mask_as_eager_joins_it(rng):
    """A user's float mask and a top-k selection: unselected keys become finfo.min, as eager makes them,
    so a row whose selected keys are all masked averages every key (eager's uniform row)."""
    from attnkit.hf.interface import attend

    q, k, v = (torch.randn(1, 2, 4, 8, generator=rng, dtype=torch.float64) for _ in range(3))
    additive = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    additive[..., 2, :2] = torch.finfo(torch.float64).min  # row 2: keys 0 and 1 masked
    indices = torch.tensor([[[0, 1], [0, 1], [0, 1], [2, 3]]])  # row 2 selects only masked keys
    out, _ = attend(_Module(), q, k, v, additive, 0.0, None, None, {"indices": indices})
    full = additive.masked_fill(~attnkit.masks.selected(indices, 4), torch.finfo(torch.float64).min)
    weights = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + full, dim=-1)
    torch.testing.assert_close(out, weights @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[:, :, 2], v.mean(dim=2), rtol=1e-12, atol=1e-12)

