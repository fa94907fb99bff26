"""DeepSeek's latent attention (MLA) and sparse attention (DSA): attnkit's own layers against transformers'
DeepseekV3Attention and DeepseekV32Attention with copied weights (float64, 1e-10; bfloat16 to its
tolerance), naive and absorbed, prefill and token-by-token decoding through the latent cache, padded
batches; attnkit's DeepSeek decoder loading a transformers checkpoint folder and generating its tokens, and in
float64 to 1e-10. (The bridge's DeepSeek families in float64 are the registry walk's: test_hf_families.py.)

transformers computes some of these modules in float32 whatever the model's dtype (RMSNorm upcasts to float32, eager
takes its softmax in float32): for the float64 comparisons transformers' side runs inside
float64_checks.float64_inside, attnkit's outside it, so that what is compared is the attention itself."""

from __future__ import annotations

import contextlib
import shutil
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3  # noqa: E402
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32  # noqa: E402

from attnkit.decoding import generate  # noqa: E402
from attnkit.layers import LatentAttention, LatentCache, LightningIndexer, RotaryEmbedding  # noqa: E402
from attnkit.models.deepseek import DeepSeekMoE  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal, float64_inside  # noqa: E402

SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=8,
             qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, num_hidden_layers=1, vocab_size=60)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
NAMES = {"q_a_layernorm": "q_a_norm", "kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm", "o_proj": "out_proj"}


def _pair(sparse: bool, *, q_lora_rank=12, rope=None, dtype=torch.float64):
    """(transformers' attention module, attnkit's LatentAttention with its weights)."""
    extra = dict(index_n_heads=8, index_head_dim=8, index_topk=4) if sparse else {}
    Config = transformers.DeepseekV32Config if sparse else transformers.DeepseekV3Config
    config = Config(**(SIZES | {"q_lora_rank": q_lora_rank} | extra), **({"rope_parameters": rope} if rope else {}))
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = (v32.DeepseekV32Attention if sparse else v3.DeepseekV3Attention)(config, 0).to(dtype).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            torch.nn.init.normal_(p, std=0.3)
    params = config.rope_parameters
    rotary = dict(scaling="yarn", factor=params["factor"], original_max_len=params["original_max_position_embeddings"],
                  mscale=params["mscale"], mscale_all_dim=params["mscale_all_dim"]) if rope else {}
    indexer = None
    if sparse:
        indexer = LightningIndexer(32, q_lora_rank, num_heads=8, head_dim=8, rope_dim=4, topk=4,
                                   rotary=RotaryEmbedding(4, params["rope_theta"], **rotary))
    ours = LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                           q_lora_rank=q_lora_rank, rotary=RotaryEmbedding(4, params["rope_theta"], interleaved=True,
                                                                           **rotary),
                           scale=theirs.scaling, norm_eps=config.rms_norm_eps, indexer=indexer).to(dtype)
    state = {}
    for name, tensor in theirs.state_dict().items():
        module, rest = name.split(".", 1)
        state[f"{NAMES.get(module, module)}.{rest}"] = tensor
    ours.load_state_dict(state)
    return theirs, ours, config


def _theirs(theirs, config, x, padding=None):
    """transformers' output for x (B, L, D) with cos/sin in float64, causal (and padding) in its eager mask; for a
    float64 x inside float64_checks.float64_inside (its RMSNorm and eager softmax compute in float32 otherwise), where
    attnkit's layer runs outside it."""
    B, L, _ = x.shape
    positions = torch.arange(L)[None]
    rotary = (v32.DeepseekV32RotaryEmbedding if isinstance(theirs, v32.DeepseekV32Attention) else v3.DeepseekV3RotaryEmbedding)(config)
    inv_freq = rotary.inv_freq.double() if config.rope_parameters["rope_type"] != "default" else \
        1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, 4, 2, dtype=torch.float64) / 4))
    emb = torch.cat([positions[..., None].double() * inv_freq] * 2, dim=-1)
    cos, sin = (f(emb) * rotary.attention_scaling for f in (torch.cos, torch.sin))
    allowed = torch.ones(L, L, dtype=torch.bool).tril()[None, None].expand(B, 1, L, L)
    if padding is not None:
        allowed = allowed & padding[:, None, None, :]
    mask = torch.zeros(B, 1, L, L, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
    with float64_inside() if x.dtype == torch.float64 else contextlib.nullcontext():
        out, _ = theirs(x, (cos.to(x.dtype), sin.to(x.dtype)), mask, position_ids=positions)
    return out


CASES = [("mla", False, 12, None), ("mla-yarn", False, 12, YARN), ("mla-no-query-latent", False, None, None),
         ("dsa", True, 12, None)]


@pytest.mark.parametrize(("name", "sparse", "q_lora_rank", "rope"), CASES, ids=[c[0] for c in CASES])
def test_naive_absorbed_and_cached_decoding_equal_transformers(name, sparse, q_lora_rank, rope):
    theirs, ours, config = _pair(sparse, q_lora_rank=q_lora_rank, rope=rope)
    x = torch.randn(2, 11, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = _theirs(theirs, config, x)
    for absorbed in (False, True):
        torch.testing.assert_close(ours(x, absorbed=absorbed).output, want, rtol=1e-10, atol=1e-10)
    for absorbed, steps in ((True, [1] * 11), (False, [4, 1, 6])):  # token by token, and in chunks
        cache, outputs, start = LatentCache(), [], 0
        for size in steps:
            outputs.append(ours(x[:, start:start + size], cache=cache, absorbed=absorbed).output)
            start += size
        torch.testing.assert_close(torch.cat(outputs, dim=1), want, rtol=1e-10, atol=1e-10)
        per_token = 8 + 4 + (8 if sparse else 0)  # kv_lora_rank + qk_rope_head_dim (+ the indexer's key)
        assert cache.numbers_per_token() == per_token and cache.length == 11


@pytest.mark.parametrize("sparse", [False, True], ids=["mla", "dsa"])
def test_a_left_padded_batch_equals_transformers_on_its_real_rows(sparse):
    """Pad rows have no key: attnkit's zeros, eager's uniform average (its documented difference); every real
    row equal."""
    theirs, ours, config = _pair(sparse)
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, :3] = False
    want = _theirs(theirs, config, x, padding)
    for absorbed in (False, True):
        got = ours(x, key_mask=padding, absorbed=absorbed).output
        torch.testing.assert_close(got[padding], want[padding], rtol=1e-10, atol=1e-10)


def test_bfloat16_is_within_its_tolerance_of_transformers_float64():
    theirs, ours, config = _pair(False)
    x = torch.randn(2, 11, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = _theirs(theirs, config, x)
    ours = ours.to(torch.bfloat16)
    for absorbed in (False, True):
        got = ours(x.to(torch.bfloat16), absorbed=absorbed).output.double()
        assert (got - want).abs().max() / want.abs().max() < 3e-2, absorbed


def test_gradients_of_the_two_ways_equal_transformers():
    theirs, ours, config = _pair(True)
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    (_theirs(theirs, config, x) ** 2).sum().backward()
    want = {NAMES.get(n.split(".")[0], n.split(".")[0]) + "." + n.split(".", 1)[1]: p.grad for n, p in theirs.named_parameters()
            if p.grad is not None and not n.startswith("indexer")}
    for absorbed in (False, True):
        ours.zero_grad()
        (ours(x, absorbed=absorbed).output ** 2).sum().backward()
        for name, grad in want.items():
            torch.testing.assert_close(dict(ours.named_parameters())[name].grad, grad, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------ the native decoder
def _checkpoint(sparse: bool, folder, **overrides) -> tuple[object, str]:
    """(transformers' tiny DeepSeek-V3 or V3.2 model with random weights, the folder it was saved to: ``folder``, a
    test's ``tmp_path``, which pytest removes)."""
    extra = (dict(index_n_heads=8, index_head_dim=8, index_topk=4) if sparse else {}) | overrides
    Config = transformers.DeepseekV32Config if sparse else transformers.DeepseekV3Config
    config = Config(**(SIZES | dict(num_hidden_layers=3, intermediate_size=40, moe_intermediate_size=12,
                                    first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                    num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                    max_position_embeddings=256) | extra), rope_parameters=YARN)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.copy_(0.1 * torch.randn_like(module.e_score_correction_bias))
    model.save_pretrained(folder)
    return model, str(folder)


@pytest.mark.parametrize("sparse", [False, True], ids=["deepseek-v3", "deepseek-v3.2"])
def test_the_native_decoder_loads_a_checkpoint_and_generates_transformers_tokens(sparse, tmp_path):
    theirs, folder = _checkpoint(sparse, tmp_path)
    ours = load_hf_folder(folder)
    ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-4, atol=1e-4)
        want = theirs.generate(ids[:1], max_new_tokens=10, min_new_tokens=10, do_sample=False)[0, 12:]
    got = generate(ours, ids[:1], max_new_tokens=10).tokens[0, :10]
    assert torch.equal(got, want)


@pytest.mark.parametrize("sparse", [False, True], ids=["deepseek-v3", "deepseek-v3.2"])
def test_the_native_decoder_in_float64_equals_transformers_to_1e_10(sparse, tmp_path):
    """The whole model (YaRN, the group-limited router with its correction bias, the sparse indexer), with
    transformers' float32 steps kept in float64 (float64_checks), a batch as it is and left-padded."""
    theirs, folder = _checkpoint(sparse, tmp_path)
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_the_latent_norms_keep_their_own_epsilon_whatever_rms_norm_eps_says(tmp_path):
    """transformers (and DeepSeek's reference code) build q_a_layernorm and kv_a_layernorm with eps 1e-6,
    whatever rms_norm_eps is: with rms_norm_eps 1e-2 the logits still agree."""
    theirs, folder = _checkpoint(False, tmp_path, rms_norm_eps=1e-2)
    ours = load_hf_folder(folder)
    assert ours.layers[0].self_attn.kv_a_norm.eps == 1e-6 and ours.layers[0].attn_norm.eps == 1e-2
    ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=1e-4, atol=1e-4)


def test_the_one_loader_takes_deepseek_and_refuses_other_families_by_name(tmp_path):
    """load_hf_folder loads every family attnkit has natively, DeepSeek included; load_deepseek_folder is its
    deprecated old name for one release; a family attnkit does not have natively is refused by its model_type
   ."""
    import json

    from attnkit.models import deepseek
    from attnkit.models.hf_config import UnsupportedConfigError

    theirs, folder = _checkpoint(False, tmp_path / "checkpoint")
    with pytest.warns(FutureWarning, match="load_hf_folder"):
        old = deepseek.load_deepseek_folder(folder)
    ids = torch.randint(3, 60, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(old(ids).logits, load_hf_folder(folder)(ids).logits, rtol=0, atol=0)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "jamba"}))
    with pytest.raises(UnsupportedConfigError, match="model_type 'jamba' is not one attnkit has natively"):
        load_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": ["llama"]}))  # not a name: refused as such
    with pytest.raises(UnsupportedConfigError, match=r"config.json's model_type must be a string, got \['llama'\]"):
        load_hf_folder(tmp_path)


def test_a_checkpoint_with_a_key_attnkit_does_not_implement_is_refused(tmp_path):
    import json

    from attnkit.models.hf_config import UnsupportedConfigError

    _, folder = _checkpoint(False, tmp_path / "checkpoint")
    config = json.loads(open(f"{folder}/config.json").read())
    config["scoring_func"] = "softmax"
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(f"{folder}/model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedConfigError, match="scoring_func='softmax' is not supported"):
        load_hf_folder(tmp_path)


def test_a_bfloat16_model_routes_in_float32_with_the_checkpoints_exact_router_as_transformers_does(tmp_path):
    # transformers keeps gate.weight and e_score_correction_bias float32 in a bfloat16 model
    # (_keep_in_fp32_modules_strict); rounded to bfloat16, the bias would choose other experts.
    _, folder = _checkpoint(False, tmp_path / "checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    ours = load_hf_folder(folder, dtype=torch.bfloat16)
    routers = [m for m in theirs.modules() if hasattr(m, "e_score_correction_bias")]
    moes = [m for m in ours.modules() if isinstance(m, DeepSeekMoE)]
    assert len(routers) == len(moes) == 2
    h = torch.randn(64, 32, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for router, moe in zip(routers, moes):
        assert moe.gate_weight.dtype == moe.score_bias.dtype == torch.float32
        assert torch.equal(moe.gate_weight, router.weight) and torch.equal(moe.score_bias, router.e_score_correction_bias)
        _, want_weights, want = router(h)
        got, got_weights = moe.route(h)
        order_want, order_got = want.sort(dim=-1), got.sort(dim=-1)
        assert torch.equal(order_got.values, order_want.values)
        torch.testing.assert_close(got_weights.gather(1, order_got.indices), want_weights.gather(1, order_want.indices))
    rounded = moes[0].score_bias.to(torch.bfloat16).float()
    assert not torch.equal(rounded, moes[0].score_bias)  # the case can tell: bfloat16 would round the bias
    moe = moes[0].to(torch.float64)  # a wider dtype applies as asked
    assert moe.gate_weight.dtype == moe.score_bias.dtype == torch.float64
