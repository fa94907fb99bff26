"""What py-spy sampled for mha_pyspy.txt: MultiHeadAttention (D 128, H 4, L 16) called under no_grad for 15 s.

    py-spy record -r 3000 -f raw -o mha_spy.txt -- python mha_pyspy_loop.py
    python pyspy_by_line.py mha_spy.txt "step (" 45 > mha_pyspy.txt
"""
import time

import torch

import attnkit

torch.set_num_threads(1)
torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(128, 4).eval()
x = torch.randn(1, 16, 128)


def step():
    return layer(x)


with torch.no_grad():
    start = time.time()
    while time.time() - start < 15:
        for _ in range(100):
            step()
