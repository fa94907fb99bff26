"""The hybrids' submodules (blocks, token mixers, their projections and norms, the mixtures, the final norm and head)
are called without ``nn.Module.__call__`` where that call would add nothing (``called``, ``normalised``,
``project_by_name``), as DecoderLM's are (tests/models/test_module_calls.py): the same numbers bit for bit, and a
hook on any of them still runs and its result is used. Tiny Qwen3-Next, Kimi Linear and MiniMax-01 models saved by
transformers, loaded by attnkit's one loader, in float64."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from hybrid_checks import ids, saved_checkpoint  # noqa: E402

from attnkit.models.pretrained import load_hf_folder  # noqa: E402

COMMON = dict(vocab_size=60, hidden_size=32, num_hidden_layers=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "qwen3_next": lambda: transformers.Qwen3NextConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=128,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
    "kimi_linear": lambda: transformers.KimiLinearConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=48, moe_intermediate_size=16,
        num_experts=8, num_experts_per_token=2, num_shared_experts=1, num_expert_group=2, topk_group=1,
        routed_scaling_factor=2.0, linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    "minimax": lambda: transformers.MiniMaxConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=24, num_local_experts=4,
        num_experts_per_tok=2, block_size=8,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"]),
}
# a submodule of each kind, by its path in attnkit's model (layer 1 is a linear layer in every family)
HOOKED = {
    "qwen3_next": ["layers.1", "layers.1.linear_attn", "layers.1.linear_attn.in_proj_qkvz", "layers.1.linear_attn.norm",
                   "layers.1.input_layernorm", "layers.1.mlp", "layers.1.mlp.gate", "layers.1.mlp.shared_expert",
                   "layers.3.self_attn", "norm", "lm_head"],
    "kimi_linear": ["layers.1", "layers.1.self_attn", "layers.1.self_attn.k_proj", "layers.1.self_attn.forget_gate",
                    "layers.1.self_attn.forget_gate.f_a_proj", "layers.1.self_attn.o_norm", "layers.1.attn_norm",
                    "layers.1.mlp", "layers.1.mlp.shared", "norm", "lm_head"],
    "minimax": ["layers.1", "layers.1.self_attn", "layers.1.self_attn.qkv_proj", "layers.1.self_attn.norm",
                "layers.1.self_attn.output_gate", "layers.1.post_attention_layernorm", "layers.1.mlp",
                "layers.1.mlp.gate", "layers.1.mlp.experts", "norm", "lm_head"],
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request):
    build = CONFIGS[request.param]
    _, folder = saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(build(),
                                                                                       attn_implementation="eager"))
    try:
        ours = load_hf_folder(folder).double().eval()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return request.param, ours


def _decoded(model, tokens) -> torch.Tensor:
    """Logits of a prefill of 5 tokens then one token at a time, through the model's caches."""
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :5], cache=cache).logits]
        steps += [model(tokens[:, t:t + 1], cache=cache).logits for t in range(5, tokens.shape[1])]
    return torch.cat(steps, dim=1)


def test_the_same_numbers_without_the_module_calls(model):
    _, ours = model
    tokens = ids(4, batch=2, length=8)
    fast = _decoded(ours, tokens)
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)  # every call a module's
    try:
        slow = _decoded(ours, tokens)
    finally:
        handle.remove()
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)


def test_a_hook_on_any_submodule_still_runs_and_its_result_is_used(model):
    family, ours = model
    tokens = ids(5, batch=1, length=7)
    want = _decoded(ours, tokens)
    for path in HOOKED[family]:
        module = ours.get_submodule(path)
        seen = []

        def shifted(module, args, out, path=path):  # (a shift that differs by channel: a norm after it would undo
            seen.append(path)                         # a scale, a router's softmax a constant shift)
            x = out.output if hasattr(out, "_fields") else out  # a mixer's AttentionOutput, or a tensor
            x = x + torch.linspace(0, 1, x.shape[-1], dtype=x.dtype)
            return out._replace(output=x) if hasattr(out, "_fields") else x

        handle = module.register_forward_hook(shifted)
        try:
            got = _decoded(ours, tokens)
        finally:
            handle.remove()
        assert seen and set(seen) == {path}, path  # one call a forward (a prefill and two steps)
        assert not torch.allclose(got, want), path
    torch.testing.assert_close(_decoded(ours, tokens), want, rtol=0, atol=0)  # every hook removed: as before
