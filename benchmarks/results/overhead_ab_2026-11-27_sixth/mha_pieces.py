"""Where MultiHeadAttention's self-attention call (D 128, H 4, B 2, L 16, eval, no_grad, one thread) spends its time
beyond the ops it runs, in context: each variant stands one piece of the code in for what it costs at its least
(a patch applied only around that variant's rounds), cumulatively, so the differences between rows are the pieces'
costs inside a real call (a piece timed alone costs about half as much: fewer cache and branch misses).
Beside them: the same ops written out (one packed projection, SDPA, the NaN rule's look) and nn.MultiheadAttention.
``--padded``: the same with a key mask (the second row's last three keys padding) and nn.MultiheadAttention's
key_padding_mask. Output: mha_pieces.txt, mha_pieces_padded.txt."""
import math
import sys

import torch
import torch.nn.functional as F
from _interleaved import best_us
from torch import nn

import attnkit
from attnkit.functional import nan
from attnkit.functional.attention import make_output
from attnkit.functional.backends import sdpa
from attnkit.layers import attending, multihead

attention_module = sys.modules["attnkit.functional.attention"]
padded = "--padded" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)
B, L, D, H = 2, 16, 128, 4
E = D // H
layer = attnkit.MultiHeadAttention(D, H).eval()
theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
x = torch.randn(B, L, D)
key_mask = torch.ones(B, L, dtype=torch.bool)
key_mask[1, -3:] = False
keys = key_mask.view(B, 1, 1, L) if padded else None
packed, out_proj = layer._packed_qkv, layer.out_proj


def written(look: bool):
    def call():
        qkv = F.linear(x, packed.weight, packed.bias)
        q, k, v = qkv.view(B, L, 3 * H, E).transpose(1, 2).split_with_sizes((H, H, H), 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        if look:
            math.isnan(qkv.amax().item() if padded else out.amax().item())
        return F.linear(out.transpose(1, 2).reshape(B, L, D), out_proj.weight, out_proj.bias)
    return call


saved = {"packed": multihead.packed_projection, "attend": attending._Plain.attend, "check": multihead.MultiHeadAttention._check_inputs,
         "applied": nan.applied, "mask_for": attending.AttentionCall.mask_for, "direct": attention_module._direct_mask,
         "masked": sdpa.masked}


def restore():
    multihead.packed_projection, attending._Plain.attend = saved["packed"], saved["attend"]
    multihead.MultiHeadAttention._check_inputs, nan.applied = saved["check"], saved["applied"]
    attending.AttentionCall.mask_for, attention_module._direct_mask = saved["mask_for"], saved["direct"]
    sdpa.masked = saved["masked"]


def bare_projection():
    multihead.packed_projection = lambda p, layers, x: F.linear(x, p.weight, p.bias)


def bare_attend():  # the strategy hands SDPA and the rule's look their tensors straight
    bare_projection()

    def attend(self, layer, q, key, value, call):
        k, v = call.kv
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        math.isnan(q._base.amax().item() if padded else out.amax().item())
        return make_output((out, None, None))
    attending._Plain.attend = attend


def bare_checks():
    bare_attend()
    multihead.MultiHeadAttention._check_inputs = lambda self, query, key, value: None


def no_look():
    nan.applied = lambda q, k, v, dims, output, lse, weights, heads: (output, lse, weights)


def no_mask_for():
    no_look()
    attending.AttentionCall.mask_for = lambda self, B, S: keys


def no_direct():
    no_mask_for()
    attention_module._direct_mask = lambda *args: keys


def bare_masked():
    no_direct()
    sdpa.masked = lambda q, k, v, mask, bias, options: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


call = (lambda: layer(x, key_mask=key_mask)) if padded else (lambda: layer(x))
variants = {"MultiHeadAttention, as it is": call}
if padded:
    variants |= {
        "  NaN rule's Python gone (its look too)": (no_look, call, restore),
        "  + the key mask's (B, 1, 1, S) built for free": (no_mask_for, call, restore),
        "  + _direct_mask's checks gone": (no_direct, call, restore),
        "  + sdpa.masked's questions gone": (bare_masked, call, restore),
    }
variants |= {
    "  packed projection's check gone": (bare_projection, call, restore),
    "  + the chain from the strategy to SDPA gone (look kept)": (bare_attend, call, restore),
    "  + _check_inputs gone": (bare_checks, call, restore),
    "  + nn.Module.__call__ gone (forward called)": (bare_checks, lambda: layer.forward(x, key_mask=key_mask)
                                                     if padded else layer.forward(x), restore),
    "the same ops written out, with the rule's look": written(True),
    "the same ops written out, no look": written(False),
    "nn.MultiheadAttention": (lambda: theirs(x, x, x, key_padding_mask=~key_mask, need_weights=False)) if padded
    else (lambda: theirs(x, x, x, need_weights=False)),
}
best_us(variants)
