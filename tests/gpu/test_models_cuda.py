"""Layers and models on CUDA, bf16 and float32, against their own float64 result on the CPU
(marker ``gpu``): the same weights, the same inputs, the fused kernels that ``auto`` picks on the
GPU (SDPA, flex) against the CPU's float64 path."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from attnkit import decoding, masks
from attnkit.layers import LongformerSelfAttention, MultiHeadAttention
from attnkit.models import DecoderConfig, DecoderLM, EncoderConfig, EncoderModel, pack_documents

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 5e-2}
DTYPES = list(TOLERANCE)


def _pair(module: torch.nn.Module, dtype: torch.dtype):
    """(float64 CPU copy, CUDA copy in dtype) of one module with the same weights."""
    module = module.eval()
    return copy.deepcopy(module).double(), copy.deepcopy(module).to("cuda", dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str):
    scale = want.abs().max().clamp(min=1.0)
    error = (got.double().cpu() - want).abs().max() / scale
    assert error <= TOLERANCE[dtype], f"{what}: relative error {float(error):.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 64}, {"mask": "longformer"}])
def test_multihead_attention_on_cuda(dtype, kwargs):
    torch.manual_seed(0)
    cpu, gpu = _pair(MultiHeadAttention(256, 8, num_kv_heads=2), dtype)
    x = torch.randn(2, 700, 256, dtype=torch.float64)
    if kwargs.get("mask") == "longformer":
        call_cpu = {"mask": masks.pattern_block_mask("longformer", 700, width=64)}
        call_gpu = {"mask": masks.pattern_block_mask("longformer", 700, width=64, device="cuda")}
    else:
        call_cpu = call_gpu = kwargs
    with torch.no_grad():
        want = cpu(x, **call_cpu).output
        got = gpu(x.to("cuda", dtype), **call_gpu).output
    _close(got, want, dtype, f"MultiHeadAttention {kwargs}")


LLAMA = DecoderConfig(vocab_size=512, d_model=256, num_layers=2, num_heads=8, num_kv_heads=2, d_ff=512,
                      positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [None, 96])
def test_decoder_lm_on_cuda_logits_and_greedy_tokens(dtype, window):
    torch.manual_seed(0)
    cpu, gpu = _pair(DecoderLM(dataclasses.replace(LLAMA, window=window)), dtype)
    ids = torch.randint(0, 512, (2, 300))
    with torch.no_grad():
        _close(gpu(ids.cuda()).logits, cpu(ids).logits, dtype, "logits")
    if dtype == torch.float32:
        want = decoding.generate(cpu, ids[:, :40], max_new_tokens=16).tokens
        got = decoding.generate(gpu, ids[:, :40].cuda(), max_new_tokens=16).tokens
        assert torch.equal(got.cpu(), want), "greedy tokens on CUDA equal the CPU's in float32"


def test_packed_document_training_step_on_cuda():
    torch.manual_seed(0)
    cpu, gpu = _pair(DecoderLM(LLAMA), torch.float32)
    documents = [torch.randint(1, 512, (n,)) for n in (300, 120, 500, 90)]
    ids, doc_ids = pack_documents(documents, 1024)
    losses = {}
    for name, model, device in (("cpu", cpu, "cpu"), ("gpu", gpu, "cuda")):
        model.train()
        logits = model(ids.to(device), document_ids=doc_ids.to(device)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), ids[:, 1:].flatten().to(device))
        loss.backward()
        losses[name] = (float(loss.detach()), model.layers[0].self_attn.q_proj.weight.grad.double().cpu())
    assert abs(losses["gpu"][0] - losses["cpu"][0]) < 1e-4
    torch.testing.assert_close(losses["gpu"][1], losses["cpu"][1], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_encoder_on_cuda(dtype):
    torch.manual_seed(0)
    cpu, gpu = _pair(EncoderModel(EncoderConfig(vocab_size=300, d_model=128, num_layers=2, num_heads=4, d_ff=256)), dtype)
    ids = torch.randint(0, 300, (2, 200))
    mask = torch.ones(2, 200, dtype=torch.bool)
    mask[1, 150:] = False
    with torch.no_grad():
        want = cpu(ids, mask).hidden_states
        got = gpu(ids.cuda(), mask.cuda()).hidden_states
    _close(got[mask.cuda()], want[mask], dtype, "encoder hidden states at real tokens")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_longformer_layer_on_cuda(dtype):
    torch.manual_seed(0)
    cpu, gpu = _pair(LongformerSelfAttention(128, 4, width=64), dtype)
    x = torch.randn(2, 512, 128, dtype=torch.float64)
    flags = torch.zeros(2, 512, dtype=torch.bool)
    flags[:, :3] = True
    with torch.no_grad():
        want = cpu(x, flags).output
        got = gpu(x.to("cuda", dtype), flags.cuda()).output
    _close(got, want, dtype, "LongformerSelfAttention")


def test_sink_cache_decoding_on_cuda():
    """Chunked decoding with a sinks cache equals the CPU's, token by token, in float32."""
    torch.manual_seed(0)
    cpu, gpu = _pair(DecoderLM(LLAMA), torch.float32)
    ids = torch.randint(0, 512, (1, 200))
    outputs = {}
    for name, model, device in (("cpu", cpu, "cpu"), ("gpu", gpu, "cuda")):
        cache = model.new_cache(sinks=4, window=64)
        with torch.no_grad():
            logits = [model(ids[:, i:i + 50].to(device), cache=cache).logits for i in range(0, 200, 50)]
        outputs[name] = torch.cat(logits, dim=1).double().cpu()
    _close(outputs["gpu"], outputs["cpu"], torch.float32, "logits with a sinks cache")


@pytest.mark.parametrize("attention", ["bahdanau", "none", "luong-general"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_seq2seq_training_step_on_cuda(attention, cell):
    """The RNN encoder-decoder's teacher-forced logits and every gradient on CUDA (Bahdanau through
    AdditiveRecurrence, the unpacked GRU encoder, cuDNN's LSTM) against float64 on the CPU."""
    from attnkit.models import Seq2Seq, Seq2SeqConfig

    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(300, 320, embedding_dim=32, hidden_size=48, attention=attention, cell=cell,
                                  attention_dim=24, dropout=0.0))
    want_model, got_model = _pair(model, torch.float32)
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, 300, (6, 13), generator=generator)
    lengths = torch.tensor([13, 5, 9, 1, 12, 7])
    target_in = torch.randint(4, 320, (6, 11), generator=generator)
    results = []
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # float32 products, as on the CPU
    try:
        for net, device in ((want_model, "cpu"), (got_model, "cuda")):
            logits = net(source.to(device), lengths.to(device), target_in.to(device)).logits
            logits.logsumexp(-1).sum().backward()
            results.append((logits, {name: p.grad for name, p in net.named_parameters()}))
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    (want, want_grads), (got, got_grads) = results
    _close(got, want, torch.float32, "logits")
    for name, grad in want_grads.items():
        _close(got_grads[name], grad, torch.float32, name)
