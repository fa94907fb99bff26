import torch, time
torch.set_num_threads(1)
import attnkit
torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(128, 4).eval()
x=torch.randn(1,16,128)
def step(): return layer(x)
with torch.no_grad():
    t0=time.time()
    while time.time()-t0 < 15:
        for _ in range(100): step()
