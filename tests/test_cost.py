"""The cost calculator: analytic parameter counts equal real modules; pinned literature values."""

from __future__ import annotations

import pytest
import torch

from attnkit.cost import estimate, parameter_breakdown
from attnkit.models import build_model, count_parameters, preset
from attnkit.models.config import DecoderConfig, TransformerConfig
from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderModel


@pytest.mark.parametrize("config", [
    preset("gpt2-small"), preset("bert-base"), preset("minilm-l6"), preset("smollm2-135m"), preset("transformer-small"),
    preset("transformer-base", norm="pre", positional="learned", share_embeddings=False, source_vocab=900, target_vocab=700),
    DecoderConfig(vocab_size=50, d_model=48, num_layers=3, num_heads=6, num_kv_heads=2, d_ff=80, positional="rope",
                  norm="rmsnorm", mlp="swiglu", bias=True, tie_embeddings=False, window=8),
    DecoderConfig(vocab_size=50, d_model=48, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=80, positional="rope",
                  norm="rmsnorm", mlp="swiglu", bias=False, qkv_bias=True, attention_head_dim=16, mlp_bias=True),
], ids=lambda c: type(c).__name__)
@pytest.mark.slow
def test_analytic_parameters_equal_the_built_model(config):
    if isinstance(config, TransformerConfig):
        model = build_model(config)
    else:
        model = DecoderLM(config) if isinstance(config, DecoderConfig) else EncoderModel(config)
    assert parameter_breakdown(config)["total"] == count_parameters(model)


def test_pinned_values():
    assert [estimate(preset("gpt2-small"), n).attention_matrix_entries for n in (512, 4096, 32768)] == [
        262_144, 16_777_216, 1_073_741_824]
    assert parameter_breakdown(preset("gpt2-small"))["total"] == 124_439_808
    assert parameter_breakdown(preset("llama3-8b"))["total"] == 8_030_261_248
    assert parameter_breakdown(preset("llama3-70b"))["total"] == 70_553_706_496
    assert parameter_breakdown(preset("gpt3-175b"))["total"] == 174_604_259_328
    # Llama 3 8B keeps 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per token in bf16.
    assert estimate(preset("llama3-8b"), 8192, "bf16").kv_cache_bytes_per_token == 131_072
    # GQA shrinks the cache by H / Hkv against MHA; a sliding window caps it.
    mha = estimate(preset("llama3-8b", num_kv_heads=None), 4096, "bf16")
    assert mha.kv_cache_bytes == 4 * estimate(preset("llama3-8b"), 4096, "bf16").kv_cache_bytes
    mistral = estimate(preset("mistral-7b"), 32768, "bf16")
    assert mistral.kv_cache_bytes == 4096 * mistral.kv_cache_bytes_per_token
    # FLOPs: rest = 2 x matmul parameters per token; attention grows with the context.
    gpt2 = estimate(preset("gpt2-small"), 1024, "fp32")
    assert gpt2.flops_per_token_rest == 2 * (124_439_808 - 1024 * 768 - 38_400)  # all but positions and norms
    assert gpt2.flops_per_token_attention == 4 * 12 * 768 * 1024
    assert gpt2.flops_per_sequence_attention == 4 * 12 * 768 * 1024 * 1025 // 2


def test_notes_past_the_trained_length_and_windowed_figures_with_the_dense_one():
    gpt2 = estimate(preset("gpt2-small"), 131072, "bf16")
    assert any("1,024 positions" in note and "cannot run" in note for note in gpt2.notes)
    assert estimate(preset("gpt2-small"), 1024, "bf16").notes == ()
    mistral = estimate(preset("mistral-7b"), 8192, "bf16")
    w, n = 4096, 8192
    assert mistral.attention_entries_computed == w * (w + 1) // 2 + (n - w) * w  # causal window, per head and layer
    assert mistral.flops_per_sequence_attention == 4 * 32 * 32 * 128 * mistral.attention_entries_computed
    assert any(f"{n * (n + 1) // 2:,}" in note for note in mistral.notes)  # the dense figure alongside


def test_huge_sequences_are_closed_form_and_bounded():
    """10^11 tokens: the exact count of a causal triangle (a closed form: a loop over the positions would not end)."""
    cost = estimate(preset("llama3-8b"), 10**11, "bf16")
    assert cost.flops_per_sequence_attention == 4 * 32 * 32 * 128 * (10**11 * (10**11 + 1) // 2)
    with pytest.raises(ValueError, match="seq must be an int in"):
        estimate(preset("llama3-8b"), 10**13, "bf16")


# ---------------------------------------------------------------------------------------------- sparse patterns

PATTERN_CASES = [
    ("causal", {}), ("window", {"width": 6}), ("window", {"width": 300}),
    ("longformer", {"width": 6, "num_global": 3}), ("longformer", {"width": 8, "num_global": 0}),
    ("longformer", {"width": 200, "num_global": 70}), ("sinks", {"sinks": 3, "window": 5}),
    ("sinks", {"sinks": 0, "window": 1}), ("documents", {"documents": 3}), ("documents", {"documents": 7}),
    ("prefix-lm", {"prefix": 4}), ("dilated", {"width": 6, "dilation": 3}), ("dilated", {"width": 10, "dilation": 1}),
]


def _dense_pattern(name, n, options):
    import torch

    from attnkit import masks

    if name == "causal":
        mod = masks.causal_mod()
    elif name == "window":
        mod = masks.window_mod(options["width"])
    elif name == "longformer":
        flags = torch.zeros(n, dtype=torch.bool)
        flags[: options["num_global"]] = True
        mod = masks.longformer_mod(options["width"], flags)
    elif name == "sinks":
        mod = masks.sinks_window_mod(options["sinks"], options["window"])
    elif name == "documents":
        mod = masks.document_mod(torch.arange(n) * options["documents"] // n)
    elif name == "prefix-lm":
        mod = masks.prefix_lm_mod(options["prefix"])
    else:
        mod = masks.dilated_window_mod(options["width"], options["dilation"])
    return masks.block_mask(mod, None, None, n, n, block=16).to_dense()[0, 0]


@pytest.mark.parametrize("n", [1, 2, 17, 100])
@pytest.mark.parametrize("name, options", PATTERN_CASES)
def test_pattern_pairs_in_closed_form_equal_the_masks_counted(name, options, n):
    from attnkit.cost import pattern_pairs

    if name == "prefix-lm":
        options = {"prefix": min(options["prefix"], n)}
    dense = _dense_pattern(name, n, options)
    pairs, last, exact = pattern_pairs(name, n, **options)
    assert exact and pairs == int(dense.sum())
    if last is not None:
        assert last == int(dense[-1].sum())


def test_bigbird_pairs_are_an_upper_bound():
    from attnkit import masks
    from attnkit.cost import pattern_pairs

    n = 1024
    dense = masks.block_mask(masks.bigbird_mod(n, window_blocks=3, num_global=1, random_blocks=3, block=64), None, None, n, n).to_dense()
    pairs, _, exact = pattern_pairs("bigbird", n, window_blocks=3, num_global=1, random_blocks=3, block=64)
    assert not exact and int(dense.sum()) <= pairs <= 1.5 * int(dense.sum())




def test_deepseek_v3_as_its_report_counts_it_and_its_latent_cache():
    """DeepSeek-V3: 671B parameters, 37B activated a token (DeepSeek-AI 2024, table 1); its cache holds the
    latent, 61 x (512 + 64) x 2 = 70,272 bytes a token in bf16, against every head's keys and values."""
    from attnkit.cost import estimate
    from attnkit.models.config import PRESETS

    cost = estimate(PRESETS["deepseek-v3"], 4096, "bf16")
    assert abs(cost.parameters["total"] - 671e9) / 671e9 < 0.002
    activated = cost.flops_per_token_rest / 2  # 2 FLOPs per multiply-add: the parameters a token goes through
    assert 36e9 < activated < 38.5e9
    assert cost.kv_cache_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    alternatives = dict(cost.kv_cache_alternatives)
    assert alternatives["multi-head attention (keys and values of every head)"] == 61 * 128 * (192 + 128) * 2
    lite = estimate(PRESETS["deepseek-v2-lite"], 4096, "bf16")
    assert abs(lite.parameters["total"] - 15.7e9) / 15.7e9 < 0.01  # DeepSeek-V2-Lite: 15.7B
    assert lite.kv_cache_bytes_per_token == 27 * (512 + 64) * 2


def test_sparse_attention_caps_the_pairs_a_query_scores():
    import dataclasses

    from attnkit.cost import estimate
    from attnkit.models.config import PRESETS

    sparse = dataclasses.replace(PRESETS["deepseek-v3"], index_topk=2048)
    dense, selected = estimate(PRESETS["deepseek-v3"], 32768), estimate(sparse, 32768)
    assert selected.attention_entries_computed == 2048 * 2049 // 2 + (32768 - 2048) * 2048
    assert selected.flops_per_sequence_attention < dense.flops_per_sequence_attention / 3
    assert selected.kv_cache_bytes_per_token == 61 * (512 + 64 + 128) * 2  # the indexer's keys cached too


def test_a_hybrids_decoding_memory_is_its_softmax_kv_plus_a_constant_state_measured_on_attnkits_caches():
    """Qwen3-Next-80B-A3B holds 12 x 2 x 2 x 256 x 2 = 24,576 bytes a token (bf16) plus a
    constant state; attnkit's own layers of that shape, decoding, hold exactly what the calculator says."""
    from attnkit.cost import HYBRID_PRESETS, hybrid_memory
    from attnkit.layers import GatedAttention, GatedDeltaNet, KVCache, LinearStateCache

    shape = HYBRID_PRESETS["qwen3-next-80b-a3b"]
    memory = hybrid_memory(shape, seq=65536, dtype_bytes=2)
    assert memory.kv_bytes_per_token == 24_576 and memory.all_softmax_bytes_per_token == 98_304
    assert memory.total_bytes == 65536 * 24_576 + memory.state_bytes
    n = memory.crossover
    assert n * memory.kv_bytes_per_token + memory.state_bytes < n * memory.all_softmax_bytes_per_token
    assert (n - 1) * memory.kv_bytes_per_token + memory.state_bytes >= (n - 1) * memory.all_softmax_bytes_per_token
    torch.manual_seed(0)
    full = GatedAttention(2048, 16, num_kv_heads=2, head_dim=256).to(torch.bfloat16).eval()
    linear = GatedDeltaNet(2048, 16, 32, 128, 128).to(torch.bfloat16).eval()
    kv, state = KVCache(), LinearStateCache()
    with torch.no_grad():
        for _ in range(3):  # three decoding steps
            x = torch.randn(1, 1, 2048, dtype=torch.bfloat16)
            full(x, is_causal=True, cache=kv)
            linear(x, cache=state)
    kv_bytes = sum(t.numel() * t.element_size() for t in (kv.keys, kv.values))
    assert kv_bytes == 3 * memory.kv_bytes_per_token // shape.full_layers
    held = state.conv.numel() * state.conv.element_size() + state.state.numel() * state.state.element_size()
    assert held * shape.linear_layers == memory.state_bytes and state.state.dtype == torch.float32


def test_the_cost_command_knows_the_hybrids(tmp_path, capsys):
    from attnkit.cli import main

    assert main(["cost", "--model", "qwen3-next-80b-a3b", "--seq", "65536", "--plot", str(tmp_path / "m.png")]) == 0
    out = capsys.readouterr().out
    assert "24,576 bytes per token" in out and "from 1,049 tokens on" in out
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["cost", "--model", "kimi-linear-48b-a3b"]) == 0 and "6,912 bytes per token" in capsys.readouterr().out
    assert main(["cost", "--model", "qwen3-next-80b-a3b", "--pattern", "window"]) == 2
    assert main(["cost", "--model", "llama3-8b", "--plot", str(tmp_path / "x.png")]) == 2


def test_the_mamba2_hybrids_presets_hold_a_hand_count_and_attnkits_mamba2_layer_holds_that_state():
    """Granite-4.0-H-Micro in bf16: 4 attention layers x 2 x 8 KV heads x 64 x 2 bytes = 8,192 bytes a token; 36
    Mamba-2 states of 64 heads x 128 x 64 float32 numbers = 75,497,472 bytes and convolution tails of 3 tokens x
    (4,096 + 2 x 128) channels x 2 bytes = 940,032. Nemotron-H-8B: 4 x 2 x 8 x 128 x 2 = 16,384 a token, 24 states of
    128 x 128 x 64 x 4 = 100,663,296 bytes, tails 24 x 3 x (8,192 + 2 x 8 x 128) x 2 = 1,474,560; its 24 MLP layers
    hold nothing. attnkit's Mamba2 layer of Granite's shape, decoding, holds what the count says."""
    from attnkit.cost import HYBRID_PRESETS, hybrid_memory
    from attnkit.layers import LinearStateCache, Mamba2

    granite = hybrid_memory(HYBRID_PRESETS["granite-4.0-h-micro"], seq=65536, dtype_bytes=2)
    assert (granite.kv_bytes_per_token, granite.recurrent_state_bytes, granite.conv_state_bytes) == (
        8_192, 75_497_472, 940_032)
    assert granite.all_softmax_bytes_per_token == 40 * 2 * 8 * 64 * 2
    nemotron = hybrid_memory(HYBRID_PRESETS["nemotron-h-8b"], seq=65536, dtype_bytes=2)
    assert (nemotron.kv_bytes_per_token, nemotron.recurrent_state_bytes, nemotron.conv_state_bytes) == (
        16_384, 100_663_296, 1_474_560)
    assert nemotron.all_softmax_bytes_per_token == 28 * 2 * 8 * 128 * 2  # the 28 layers that mix tokens
    torch.manual_seed(0)
    layer = Mamba2(2048, 64, 64, 128, n_groups=1).to(torch.bfloat16).eval()
    cache = LinearStateCache()
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(1, 1, 2048, dtype=torch.bfloat16), cache=cache)
    held = cache.conv.numel() * cache.conv.element_size() + cache.state.numel() * cache.state.element_size()
    assert held * 36 == granite.state_bytes and cache.state.dtype == torch.float32


def test_a_mamba2_hybrids_config_json_gives_its_presets_shape():
    """``shape_from_hf`` reads Granite 4.0-H's and Nemotron-H's config.json through attnkit's own loaders' readers:
    the published sizes give the presets' numbers."""
    transformers = pytest.importorskip("transformers")
    from attnkit.cost import HYBRID_PRESETS, hybrid_memory, shape_from_hf

    types = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"]
             + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)
    granite = transformers.GraniteMoeHybridConfig(
        vocab_size=100352, hidden_size=2048, num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
        mamba_n_heads=64, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
        num_local_experts=0, shared_intermediate_size=8192, layer_types=types).to_dict()
    nemotron = transformers.NemotronHConfig(
        hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-").to_dict()
    for hf, name in ((granite, "granite-4.0-h-micro"), (nemotron, "nemotron-h-8b")):
        read, published = shape_from_hf(hf), HYBRID_PRESETS[name]
        assert hybrid_memory(read, 8192, 2) == hybrid_memory(published, 8192, 2), name
        assert read.full_kind == published.full_kind, name
