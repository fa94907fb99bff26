import torch, time, math
from torch import nn
import torch.nn.functional as F
torch.set_num_threads(1)
import attnkit
from attnkit.layers._linear import packed_projection
def t(name, f, n=2000, r=20):
    best=1e9
    for _ in range(r):
        t0=time.perf_counter()
        for _ in range(n): f()
        best=min(best,(time.perf_counter()-t0)/n)
    print(f"{name:40s} {best*1e6:7.2f} us")
torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(128, 4).eval()
theirs = nn.MultiheadAttention(128, 4, batch_first=True).eval()
x=torch.randn(1,16,128)
P=layer._packed_qkv; W=P.weight; b=P.bias; Wo=layer.out_proj.weight; bo=layer.out_proj.bias
def ops():
    qkv=F.linear(x,W,b)
    q,k,v=qkv.view(1,16,12,32).transpose(1,2).split_with_sizes((4,4,4),1)
    o=F.scaled_dot_product_attention(q,k,v)
    math.isnan(o.amax().item())
    return F.linear(o.transpose(1,2).reshape(1,16,128),Wo,bo)
qkv_modules=layer._qkv()
with torch.no_grad():
  for _ in range(2):
    t("ours", lambda: layer(x))
    t("ours forward", lambda: layer.forward(x))
    t("ops written", ops)
    t("theirs", lambda: theirs(x,x,x,need_weights=False))
    t("packed_projection", lambda: packed_projection(P, qkv_modules, x))
    t("F.linear packed", lambda: F.linear(x,W,b))
