"""attnkit's TransformerEncoder (2 post-norm layers, D 128, 4 heads, d_ff 256) on a padded batch of 2 x 16 tokens
(the second row's last three keys padding, a (B, 1, 1, S) mask), eval, no_grad, one thread: microseconds a forward,
best of 30 rounds of 100. Run once per side (the README's loop); prints one JSON line."""
import json
import time

import torch

from attnkit.models.config import TransformerConfig
from attnkit.models.transformer import TransformerEncoder

torch.set_num_threads(1)
torch.manual_seed(0)
config = TransformerConfig(source_vocab=100, target_vocab=100, d_model=128, num_heads=4, d_ff=256, encoder_layers=2,
                           decoder_layers=1, dropout=0.0)
enc = TransformerEncoder(config).eval()
x = torch.randn(2, 16, 128)
mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
mask[1, ..., -3:] = False
best = float("inf")
with torch.no_grad():
    for _ in range(50):
        enc(x, mask)
    for _ in range(30):
        t = time.perf_counter()
        for _ in range(100):
            enc(x, mask)
        best = min(best, (time.perf_counter() - t) / 100 * 1e6)
print(json.dumps({"encoder_forward_us": best}))
