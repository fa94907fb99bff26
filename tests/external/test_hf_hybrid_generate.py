"""``attnkit generate`` on the native hybrids (Qwen3-Next, Qwen3.5, Kimi Linear, MiniMax-01): a checkpoint folder
with its tokenizer, the command's printed completion equal to transformers' greedy continuation of the same prompt,
decoded by the same tokenizer."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnkit.cli import main  # noqa: E402

VOCAB = 64


def _config(family: str):
    tokens = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "qwen3_next":
        return transformers.Qwen3NextConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=48, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, layer_types=["linear_attention"] * 3 + ["full_attention"], **tokens)
    if family == "qwen3_5_text":
        return transformers.Qwen3_5TextConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, layer_types=["linear_attention"] * 3 + ["full_attention"], **tokens)
    if family == "kimi_linear":
        return transformers.KimiLinearConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
            q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=48,
            moe_intermediate_size=16, num_experts=8, num_experts_per_token=2, num_shared_experts=1, num_expert_group=2,
            topk_group=1, linear_num_heads=2, linear_head_dim=8, mlp_layer_types=["dense"] + ["sparse"] * 3,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"], **tokens)
    return transformers.MiniMaxConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, block_size=8,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"], **tokens)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "kimi_linear", "minimax"])
def test_attnkit_generate_continues_a_hybrid_checkpoint_as_transformers_does(family, tmp_path, capsys):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "A_log" not in name:
                p.add_(0.3 * torch.randn_like(p))
    theirs.save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece()  # joins the words with spaces
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prompt = "w5 w17 w9 w33 w12 w40"
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        want = theirs.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    want = [t for t in want.tolist() if t != 2]  # transformers stops at (and keeps) the end token, attnkit prints neither
    assert main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == tokenizer.decode(want), (family, printed)
