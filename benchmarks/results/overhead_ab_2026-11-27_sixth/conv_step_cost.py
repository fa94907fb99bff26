"""A decoding step's causal convolution (one new token; the cache's last 3 inputs before it): F.conv1d's depthwise
kernel against the kernel's taps multiplied and summed, (1, channels, 4) float32, one thread, at the tiny models'
widths (Qwen3-Next 512 channels, Kimi Linear 768) and Qwen3-Next's own (8192). Output: conv_step_cost.txt."""
import torch
import torch.nn.functional as F
from _interleaved import best_us

torch.set_num_threads(1)
for C in (512, 768, 8192):
    full, weight = torch.randn(1, C, 4), torch.randn(C, 1, 4)
    taps = weight.view(C, 4)
    print(f"--- {C} channels", flush=True)
    best_us({"F.conv1d(full, weight, groups=channels)": lambda: F.conv1d(full, weight, None, groups=C),
             "(full * taps).sum(-1, keepdim=True)": lambda: (full * taps).sum(-1, keepdim=True)}, calls=500, rounds=20)
