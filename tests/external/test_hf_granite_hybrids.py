"""What attnkit's native Bamba and Granite 4.0-H (``attnkit.models.granite``) add to the checks every Mamba-2 model
passes (test_hf_mamba2_hybrids.py): Granite's muP multipliers each read, its published tensor names, older layer-type
names, config keys refused by name, and zamba2 refused with its reason."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.granite import GraniteHybridLM, granite_hybrid_config_from_hf  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import NATIVE_MODEL_TYPES, load_hf_folder  # noqa: E402

from hybrid_checks import (  # noqa: E402
    assert_same_logits,
    saved_checkpoint,
    tiny_config,
)


def test_granites_multipliers_each_change_the_logits():
    """Each of Granite's four muP multipliers is read: set to 1, the model's logits move."""
    _, folder = saved_checkpoint(lambda: transformers.GraniteMoeHybridForCausalLM(tiny_config("granitemoehybrid")))
    try:
        hf = json.loads(open(f"{folder}/config.json").read())
        loaded = load_hf_folder(folder)
        tokens = torch.randint(3, 60, (1, 7))
        base = loaded(tokens).logits
        for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
            assert hf[key] != 1, key
            model = GraniteHybridLM(granite_hybrid_config_from_hf(hf | {key: 1.0}))
            model.load_state_dict(loaded.state_dict())
            assert not torch.allclose(model.eval()(tokens).logits, base, atol=1e-3), key
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_granites_published_tensor_names_load(tmp_path):
    """Granite 4.0-H's checkpoints name the experts ``input_linear``, ``output_linear`` and ``router.layer``
    (transformers 5 renames them on loading): the same tensors under those names give the same model."""
    from safetensors.torch import load_file, save_file

    theirs, folder = saved_checkpoint(lambda: transformers.GraniteMoeHybridForCausalLM(tiny_config("granitemoehybrid")))
    try:
        tensors = load_file(f"{folder}/model.safetensors")
        renames = {"block_sparse_moe.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
                   "block_sparse_moe.experts.down_proj": "block_sparse_moe.output_linear.weight",
                   "block_sparse_moe.router.weight": "block_sparse_moe.router.layer.weight"}
        published = {}
        for name, tensor in tensors.items():
            for new, old in renames.items():
                name = name.replace(new, old) if name.endswith(new) else name
            published[name] = tensor
        assert any("input_linear" in name for name in published)
        save_file(published, str(tmp_path / "model.safetensors"))
        shutil.copy(f"{folder}/config.json", tmp_path / "config.json")
        assert_same_logits(load_hf_folder(tmp_path), theirs, tol=2e-4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("change, match", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(mamba_n_heads=3), "mamba_n_heads x mamba_d_head"),
    (dict(position_embedding_type="alibi"), "position_embedding_type"),
    (dict(layer_types=["mamba", "attention", "moe", "mamba"]), "layer_types"),
    (dict(some_new_key=1), "some_new_key"),
])
def test_what_attnkit_does_not_implement_is_refused_by_name(change, match):
    hf = tiny_config("granitemoehybrid").to_dict() | change
    with pytest.raises(UnsupportedConfigError, match=match):
        granite_hybrid_config_from_hf(hf)


def test_older_layer_type_names_read_as_transformers_reads_them():
    hf = tiny_config("granitemoehybrid").to_dict() | {"layer_types": ["mamba", "attention", "mamba", "mamba"]}
    assert granite_hybrid_config_from_hf(hf).layer_types == (
        "linear_attention", "full_attention", "linear_attention", "linear_attention")
    assert {"bamba", "granitemoehybrid"} <= set(NATIVE_MODEL_TYPES)


def test_zamba2_is_refused_by_name_with_the_reason(tmp_path):
    """Zamba2's shared blocks are not on attnkit's hybrid forward: its folder is refused in one line that says why
    (read from config.json's model_type, before any weight), not loaded wrong."""
    config = transformers.Zamba2Config(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       layers_block_type=["mamba", "hybrid"])
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedConfigError, match="zamba2.*shared transformer blocks"):
        load_hf_folder(tmp_path)
