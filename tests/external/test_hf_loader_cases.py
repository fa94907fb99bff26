"""The one loader (``load_hf_folder``) on checkpoint folders as they are found, each against transformers 5 on the
same folder: a config that says tied beside a checkpoint with its own head, Kimi Linear's head, Qwen3.5's expert
renormalisation, the safetensors index and stray files, multi-token-prediction tensors, null config keys, DeepSeek's
derived sizes and router groups, a call of no token through DeepSeek-V3.2's indexer, and the dtype argument."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import assert_same_logits, ids, saved_checkpoint, tiny_config  # noqa: E402

LLAMA = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64)


def _edit_config(folder: str, **changes) -> None:
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _transformers_logits(folder: str, tokens: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(tokens).logits


@pytest.fixture
def llama_untied():
    config = transformers.LlamaConfig(**LLAMA, tie_word_embeddings=False)
    theirs, folder = saved_checkpoint(lambda: transformers.LlamaForCausalLM(config), keep=())
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("family", ["llama", "qwen3_next", "minimax"])
def test_a_tied_config_with_the_checkpoints_own_head_uses_that_head_as_transformers_does(family):
    """config.json says tie_word_embeddings, the checkpoint holds an lm_head that differs from the embedding:
    transformers 5 uses the checkpoint's head, and so does attnkit, with a warning naming the key."""
    if family == "llama":
        build = lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, tie_word_embeddings=False))  # noqa: E731
    else:
        config = tiny_config(family, tie_word_embeddings=False)
        build = lambda: transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # noqa: E731
    _, folder = saved_checkpoint(build, keep=())
    try:
        _edit_config(folder, tie_word_embeddings=True)
        tokens = ids(1)
        with pytest.warns(UserWarning, match="tie_word_embeddings=true, but the checkpoint holds its own lm_head.weight"):
            ours = load_hf_folder(folder)
        with torch.no_grad():
            torch.testing.assert_close(ours(tokens).logits, _transformers_logits(folder, tokens), rtol=2e-4, atol=2e-4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_kimi_linear_keeps_its_own_head_whatever_tie_word_embeddings_says():
    """transformers' Kimi Linear never ties its head: with tie_word_embeddings true the logits are still its own
    head's."""
    config = tiny_config("kimi_linear")
    theirs, folder = saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager"))
    try:
        _edit_config(folder, tie_word_embeddings=True)
        assert_same_logits(load_hf_folder(folder), theirs, tol=2e-4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_qwen3_5_moe_renormalises_its_experts_whatever_norm_topk_prob_says():
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    theirs, folder = saved_checkpoint(lambda: transformers.Qwen3_5MoeForCausalLM(config), keep=())
    try:
        _edit_config(folder, norm_topk_prob=False)
        assert_same_logits(load_hf_folder(folder), theirs, tol=2e-4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_shards_come_from_the_index_and_a_stray_file_overrides_nothing(llama_untied):
    """A sharded folder is read through model.safetensors.index.json (each tensor from its shard); a stray
    model-backup.safetensors beside it is not read; a shard the index names that is missing is named."""
    theirs, folder = llama_untied
    tensors = load_file(f"{folder}/model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, part in halves.items():
        save_file({name: tensors[name] for name in part}, f"{folder}/{shard}")
    Path(f"{folder}/model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard for shard, part in halves.items() for name in part}}))
    Path(f"{folder}/model.safetensors").unlink()
    save_file({name: torch.zeros_like(t) for name, t in tensors.items()}, f"{folder}/model-backup.safetensors")
    tokens = ids(2)
    with torch.no_grad():
        torch.testing.assert_close(load_hf_folder(folder)(tokens).logits, theirs(tokens).logits, rtol=1e-4, atol=1e-4)
    Path(f"{folder}/model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"shards named by model.safetensors.index.json are missing: "
                                                r"\['model-00002-of-00002.safetensors'\]"):
        load_hf_folder(folder)


def test_multi_token_prediction_tensors_are_left_out_as_transformers_leaves_them():
    """Qwen3-Next's mtp.* tensors and DeepSeek-V3's extra layer (model.layers.{num_hidden_layers}.*), which
    transformers' models do not run, do not stop the load."""
    config = tiny_config("qwen3_next")
    theirs, folder = saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager"))
    try:
        tensors = load_file(f"{folder}/model.safetensors")
        tensors |= {"mtp.fc.weight": torch.randn(32, 64), "mtp.layers.0.input_layernorm.weight": torch.ones(32)}
        save_file(tensors, f"{folder}/model.safetensors")
        assert_same_logits(load_hf_folder(folder), theirs, tol=2e-4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _deepseek(folder: Path, sparse: bool = False, **overrides):
    import test_hf_deepseek

    return test_hf_deepseek._checkpoint(sparse, folder, **overrides)


def test_deepseeks_extra_layer_is_left_out(tmp_path):
    theirs, folder = _deepseek(tmp_path)
    tensors = load_file(f"{folder}/model.safetensors")
    extra = {name.replace("model.layers.2.", "model.layers.3."): t.clone() for name, t in tensors.items()
             if name.startswith("model.layers.2.")}
    save_file(tensors | extra, f"{folder}/model.safetensors")
    tokens = ids(3)
    with torch.no_grad():
        torch.testing.assert_close(load_hf_folder(folder)(tokens).logits, theirs(tokens).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys", [{"rope_scaling": None}, {"use_sliding_window": False}, {"sliding_window": None}])
@pytest.mark.parametrize("family", ["llama", "qwen3_next", "kimi_linear", "minimax"])
def test_a_null_or_false_that_means_none_is_none(family, keys):
    """Keys transformers 4.x wrote with null values (rope_scaling: null) or a switch off (use_sliding_window:
    false), which ask for nothing attnkit lacks, do not stop the load."""
    if family == "llama":
        build = lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, tie_word_embeddings=False))  # noqa: E731
    else:
        config = tiny_config(family)
        build = lambda: transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # noqa: E731
    theirs, folder = saved_checkpoint(build)
    try:
        _edit_config(folder, **keys)
        assert_same_logits(load_hf_folder(folder), theirs, tol=2e-4)
        _edit_config(folder, use_sliding_window=True)  # a switch on is refused as before: attnkit has no such key here
        if family != "llama":
            with pytest.raises(UnsupportedConfigError, match="use_sliding_window"):
                load_hf_folder(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("key, value, match", [("head_dim", 8, "head_dim=8 is not supported; supported: 4"),
                                               ("topk_group", 0, "topk_group=0 is not supported"),
                                               ("topk_group", 3, "at most n_group")])
def test_deepseek_sizes_transformers_derives_and_router_groups_are_refused_unlike_it(key, value, match, tmp_path):
    """head_dim (transformers' rotary takes its size from it: another value than qk_rope_head_dim does not run
    there) and topk_group 0 or above n_group are refused by name, where attnkit used to run something else."""
    _, folder = _deepseek(tmp_path)
    _edit_config(folder, **{key: value})
    with pytest.raises(UnsupportedConfigError, match=match):
        load_hf_folder(folder)


def test_deepseek_v32_takes_a_call_of_no_token(tmp_path):
    _, folder = _deepseek(tmp_path, sparse=True)
    ours = load_hf_folder(folder)
    cache = ours.new_cache()
    with torch.no_grad():
        assert ours(ids(0, batch=1, length=0)).logits.shape == (1, 0, 60)
        ours(ids(1, batch=1, length=5), cache=cache)
        assert ours(ids(0, batch=1, length=0), cache=cache).logits.shape == (1, 0, 60)


def test_dtype_takes_a_dtype_its_name_or_auto_and_refuses_others(llama_untied):
    theirs, folder = llama_untied
    for dtype, want in ((torch.bfloat16, torch.bfloat16), ("float16", torch.float16), ("auto", torch.float32),
                        (None, torch.float32)):
        assert next(load_hf_folder(folder, dtype=dtype).parameters()).dtype == want, dtype
    for bad in (torch.int32, "int8", 3):
        with pytest.raises(TypeError, match="dtype must be a floating-point torch dtype"):
            load_hf_folder(folder, dtype=bad)
    theirs.to(torch.bfloat16).save_pretrained(folder)  # a bfloat16 checkpoint: "auto" keeps it, as transformers 5 does
    assert next(load_hf_folder(folder, dtype="auto").parameters()).dtype == torch.bfloat16
    assert next(load_hf_folder(folder).parameters()).dtype == torch.float32
