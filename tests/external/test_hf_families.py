"""The registry walk: every family in the installed transformers that has a text model class is
either verified (in attnkit.hf.VERIFIED_FAMILIES, and then equal to eager: logits, weights,
gradients, greedy ids with the dynamic and the static cache, left padding; fp32, 1e-4; and in float64, with
the steps transformers rounds to float32 kept in float64, logits, loss and gradients to 1e-12) or refused by name
when built with attn_implementation="attnkit". No third outcome."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

import attnkit.hf  # noqa: E402
from attnkit.hf import VERIFIED_FAMILIES, UnverifiedFamily  # noqa: E402

from hf_families import check, check_float64, model_class, tiny_config  # noqa: E402


def _config(family: str):
    """The family's tiny config, else its default one, else None (its config class cannot be built
    on its own: such a family is outside the walk)."""
    try:
        return tiny_config(family)
    except Exception:  # noqa: BLE001
        try:
            return transformers.models.auto.configuration_auto.CONFIG_MAPPING[family]()
        except Exception:  # noqa: BLE001
            return None


def _named_text_families() -> list[str]:
    """Families with a causal-LM, seq2seq or masked-LM class by name (no model module is imported
    at collection: that took 15 s)."""
    from transformers.models.auto import modeling_auto as ma

    names = set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    return sorted((names | set(ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES)) & set(CONFIG_MAPPING_NAMES))


TEXT_FAMILIES = _named_text_families()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()


def test_the_walk_covers_the_registry_and_the_verified_list_is_in_it():
    assert len(TEXT_FAMILIES) > 200
    assert set(VERIFIED_FAMILIES) <= set(CONFIG_MAPPING_NAMES)


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_each_family_equals_eager_or_is_refused_by_name(family):
    cls, _ = model_class(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = _config(family)
    if cls is None or config is None:
        assert family not in VERIFIED_FAMILIES
        pytest.skip(f"{family}: transformers exports no model class or its config class cannot be built alone, "
                    "so it is outside the walk (and not verified)")
    if family in VERIFIED_FAMILIES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            problems = check(family)
        assert not problems, f"{family}: " + "; ".join(problems)
        return
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnverifiedFamily, match="is not a family attnkit has verified"):
            cls._from_config(config, attn_implementation=attnkit.hf.IMPLEMENTATION)


@pytest.mark.parametrize("family", [family for family in TEXT_FAMILIES if family in VERIFIED_FAMILIES])
def test_each_verified_family_equals_eager_in_float64(family):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problems = check_float64(family)
    assert not problems, f"{family}: " + "; ".join(problems)
