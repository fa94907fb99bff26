"""What the native hybrids' tests (Qwen3-Next, Qwen3.5, Kimi Linear, MiniMax-01, Mamba-2, Bamba, Granite 4.0-H)
check alike against transformers:
a tiny random checkpoint saved by transformers (the tiny configs: :func:`tiny_config`), the one loader's model giving
its logits on a batch with and without left padding, and its greedy tokens."""

from __future__ import annotations

import copy
import tempfile
import warnings

import torch

from attnkit.decoding import generate

LAYER_TYPES = {
    "qwen3_next": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "qwen3_5_text": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "kimi_linear": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "minimax": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
}
"""Each tiny model's four layers (layer 1 is a linear one in every family)."""

MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
             mamba_chunk_size=8)
"""The Mamba-2 layers of the tiny Bamba and Granite 4.0-H models: 4 heads of 16 channels in 2 groups, a state of 8;
transformers scans them in chunks of 8 (12 tokens span two), attnkit by its own (``SSD_CHUNK``)."""


def tiny_config(family: str, **overrides):
    """transformers' config of the hybrid tests' tiny ``family`` model (a key of :data:`LAYER_TYPES`, or "mamba2",
    "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1"): 4 layers (Mamba-2's and Falcon-H1's 3, Nemotron-H's 5) of
    width 32, a vocabulary of 60, ``overrides`` taking the place of any of its keys. MiniMax's residual scales differ
    from 1, so that a model that ignored them would be told apart."""
    import transformers

    base = dict(vocab_size=60, hidden_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "mamba2":
        return transformers.Mamba2Config(**(base | dict(num_hidden_layers=3, num_heads=4, head_dim=16, state_size=8,
                                                        n_groups=2, expand=2, chunk_size=8) | overrides))
    ssm = base | MAMBA | dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    if family == "bamba":
        return transformers.BambaConfig(**(ssm | dict(intermediate_size=48, attn_layer_indices=[2]) | overrides))
    if family == "granitemoehybrid":  # Granite 4.0-H: no position embedding, muP multipliers away from 1, experts
        return transformers.GraniteMoeHybridConfig(**(ssm | dict(
            intermediate_size=16, shared_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5)
            | overrides))
    if family == "falcon_h1":  # Falcon-H1: every muP multiplier away from 1, its own Mamba-2 width
        return transformers.FalconH1Config(**(base | dict(
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, mamba_d_ssm=48,
            mamba_n_heads=4, mamba_d_head=12, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=8,
            mamba_rms_norm=True, projectors_bias=True, embedding_multiplier=2.0, lm_head_multiplier=0.7,
            mlp_multipliers=[1.3, 0.6], key_multiplier=0.8, attention_in_multiplier=1.2, attention_out_multiplier=0.9,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.1, 0.7], ssm_in_multiplier=1.4, ssm_out_multiplier=0.75)) | overrides)
    if family == "nemotron_h":  # every kind of layer; experts in 2 groups, one kept a token, a latent width
        return transformers.NemotronHConfig(**(base | dict(
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48, mamba_num_heads=4,
            mamba_head_dim=16, n_groups=2, ssm_state_size=8, chunk_size=8, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, moe_shared_expert_intermediate_size=24, moe_latent_size=16, n_group=2,
            topk_group=1, routed_scaling_factor=1.5)) | overrides)
    keys: dict = dict(vocab_size=60, hidden_size=32, num_hidden_layers=4, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, layer_types=LAYER_TYPES[family], num_attention_heads=4)
    linear = dict(num_key_value_heads=2, head_dim=8, intermediate_size=48, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
    if family == "qwen3_next":
        keys |= linear | dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16, max_position_embeddings=128)
        return transformers.Qwen3NextConfig(**(keys | overrides))
    if family == "qwen3_5_text":
        return transformers.Qwen3_5TextConfig(**(keys | linear | overrides))
    if family == "kimi_linear":
        keys |= dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
                     v_head_dim=8, intermediate_size=48, moe_intermediate_size=16, num_experts=8,
                     num_experts_per_token=2, num_shared_experts=1, num_expert_group=2, topk_group=1,
                     routed_scaling_factor=2.0, linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=4,
                     mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
        return transformers.KimiLinearConfig(**(keys | overrides))
    keys |= dict(num_key_value_heads=2, head_dim=8, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                 block_size=8, full_attn_alpha_factor=0.9, full_attn_beta_factor=1.1, linear_attn_alpha_factor=1.2,
                 linear_attn_beta_factor=0.8, mlp_alpha_factor=0.95, mlp_beta_factor=1.05)
    return transformers.MiniMaxConfig(**(keys | overrides))  # (a family not in LAYER_TYPES: a KeyError above)


def saved_checkpoint(build, *, scale: float = 0.2, keep=("A_log",)):
    """(transformers' model, folder): ``build()`` made in eval mode with seed 0, each parameter moved by ``scale``
    times a standard normal draw (those whose names hold a word of ``keep`` left as initialised: the decay rates,
    whose random moves would make a state blow up), saved by transformers to a new folder (the caller removes it)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = build().eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if not any(word in name for word in keep):
                p.add_(scale * torch.randn_like(p))
    folder = tempfile.mkdtemp()
    theirs.save_pretrained(folder)
    return theirs, folder


def ids(seed: int, batch: int = 2, length: int = 12, vocab: int = 60) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_same_logits(ours, theirs, *, tol: float, seed: int = 1) -> None:
    """The same logits on a batch of two, as it is and with the second row left-padded by four (its real
    positions compared)."""
    tokens = ids(seed)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).logits, theirs(tokens).logits, rtol=tol, atol=tol)
        got, want = ours(tokens, mask).logits, theirs(tokens, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=tol, atol=tol)


def cached_decoding_equals_one_pass(ours, *, sizes=(5, 1, 1, 4, 3)) -> list:
    """attnkit's own exactness (a float64 model): a prefill, then tokens one at a time and a chunk, through the
    model's caches give the whole pass's logits to 1e-10. Returns the caches, for the caller's own checks."""
    tokens = ids(3, batch=1, length=sum(sizes))
    with torch.no_grad():
        whole = ours(tokens).logits
        cache, pieces, start = ours.new_cache(), [], 0
        for size in sizes:
            pieces.append(ours(tokens[:, start:start + size], cache=cache).logits)
            start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    return cache


def assert_a_call_of_no_token_is_empty(ours) -> None:
    """A call of no new token, with and without a filled cache: empty logits, and the caches as they were (the next
    token's logits those of a cache that never saw the empty call)."""
    nothing, prompt, step = ids(0, length=0), ids(7, length=5), ids(8, length=1)
    with torch.no_grad():
        assert ours(nothing).logits.shape == (2, 0, ours.config.vocab_size)
        cache, straight = ours.new_cache(), ours.new_cache()
        ours(prompt, cache=cache)
        ours(prompt, cache=straight)
        assert ours(nothing, cache=cache).logits.shape == (2, 0, ours.config.vocab_size)
        torch.testing.assert_close(ours(step, cache=cache).logits, ours(step, cache=straight).logits, rtol=0, atol=0)


def assert_same_greedy_tokens(ours, theirs, *, seed: int = 2, new: int = 12) -> None:
    """The same ``new`` greedy tokens, the end token a token like any other on both sides (transformers' generation
    config without one: with it, ``min_new_tokens`` would make transformers pick another where the end wins)."""
    prompt = ids(seed, batch=1)
    config = copy.deepcopy(theirs.generation_config)
    config.eos_token_id, config.pad_token_id = theirs.config.vocab_size, 0  # (never generated; None: the model's)
    with torch.no_grad():
        want = theirs.generate(prompt, generation_config=config, max_new_tokens=new, do_sample=False)[0, prompt.shape[1]:]
    assert len(want) == new
    assert torch.equal(generate(ours, prompt, max_new_tokens=new).tokens[0, :new], want)


def assert_same_padded_greedy_tokens(ours, theirs, *, seed: int = 4, new: int = 8, theirs_padded: bool = True) -> None:
    """A left-padded batch of three prompts (7, 3 and 5 tokens) generated greedily: the same ``new`` tokens as
    transformers' ``generate`` on the same padded batch (``theirs_padded``; else on each prompt alone, for a family
    whose padded decoding in transformers differs from its rows alone), and each row the tokens of its prompt
    alone."""
    from attnkit.decoding import pad_prompts

    tokens = ids(seed, batch=1, length=15)[0].tolist()
    prompts = [tokens[:7], tokens[7:10], tokens[10:15]]
    padded, mask = pad_prompts(prompts)
    config = copy.deepcopy(theirs.generation_config)
    config.eos_token_id, config.pad_token_id = theirs.config.vocab_size, 0  # (never generated; None: the model's)
    with torch.no_grad():
        if theirs_padded:
            want = theirs.generate(padded, attention_mask=mask, generation_config=config, max_new_tokens=new,
                                   do_sample=False)[:, padded.shape[1]:]
        else:
            want = torch.stack([theirs.generate(torch.tensor([prompt]), generation_config=config, max_new_tokens=new,
                                                do_sample=False)[0, len(prompt):] for prompt in prompts])
    got = generate(ours, padded, attention_mask=mask, max_new_tokens=new).tokens[:, :new]
    assert torch.equal(got, want), (got, want)
    for row, prompt in enumerate(prompts):
        alone = generate(ours, torch.tensor([prompt]), max_new_tokens=new).tokens[0, :new]
        assert torch.equal(got[row], alone), row
