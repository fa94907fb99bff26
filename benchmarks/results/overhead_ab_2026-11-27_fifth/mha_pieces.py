"""MultiHeadAttention (D 128, H 4, L 16) against nn.MultiheadAttention and against its own ops written out, in one
process, one thread: best of 20 rounds of 1,000 calls, two passes. Output: mha_pieces.txt."""
import math

import torch
import torch.nn.functional as F
from _timing import t  # (this folder's timer)
from torch import nn

import attnkit
from attnkit.layers.calls import packed_projection

torch.set_num_threads(1)


def timed(name, f):
    t(name, f, n=1000, r=20)


torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(128, 4).eval()
theirs = nn.MultiheadAttention(128, 4, batch_first=True).eval()
x = torch.randn(1, 16, 128)
packed, qkv_modules = layer._packed_qkv, layer._qkv()
W, b, Wo, bo = packed.weight, packed.bias, layer.out_proj.weight, layer.out_proj.bias


def written_out():  # the layer's ops, the NaN rule's look included
    q, k, v = F.linear(x, W, b).view(1, 16, 12, 32).transpose(1, 2).split_with_sizes((4, 4, 4), 1)
    o = F.scaled_dot_product_attention(q, k, v)
    math.isnan(o.amax().item())
    return F.linear(o.transpose(1, 2).reshape(1, 16, 128), Wo, bo)


for _ in range(2):
    timed("attnkit, autograd on", lambda: layer(x))
    timed("nn.MultiheadAttention, autograd on", lambda: theirs(x, x, x, need_weights=False))
    with torch.no_grad():
        timed("attnkit, no_grad", lambda: layer(x))
        timed("nn.MultiheadAttention, no_grad", lambda: theirs(x, x, x, need_weights=False))
        timed("the same ops written out, no_grad", written_out)
        timed("packed_projection, no_grad", lambda: packed_projection(packed, qkv_modules, x))
        timed("F.linear through the packed weight", lambda: F.linear(x, W, b))
    with torch.inference_mode():
        timed("attnkit, inference_mode", lambda: layer(x))
        timed("nn.MultiheadAttention, inference_mode", lambda: theirs(x, x, x, need_weights=False))
