import torch, time
from torch import nn
torch.set_num_threads(1)
import attnkit
def t(name, f, n=1000, r=20):
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
for _ in range(2):
    t("ours grad", lambda: layer(x).output)
    t("theirs grad", lambda: theirs(x,x,x,need_weights=False)[0])
    with torch.no_grad():
        t("ours nograd", lambda: layer(x).output)
        t("theirs nograd", lambda: theirs(x,x,x,need_weights=False)[0])
    with torch.inference_mode():
        t("ours inference", lambda: layer(x).output)
        t("theirs inference", lambda: theirs(x,x,x,need_weights=False)[0])
