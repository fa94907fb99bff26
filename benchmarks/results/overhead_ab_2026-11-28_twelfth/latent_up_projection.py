import torch, time
torch.manual_seed(0)
for (B, S, r, H, c) in ((1, 16, 64, 4, 24), (1, 512, 512, 16, 192), (4, 128, 256, 8, 96)):
    lat = torch.randn(B, 1, S, r); w = torch.randn(H, c, r)
    f1 = lambda: torch.einsum("bosr,hcr->bhsc", lat, w)
    f2 = lambda: (lat.reshape(B * S, r) @ w.reshape(-1, r).T).view(B, S, H, -1).transpose(1, 2)
    print((f1() - f2()).abs().max().item(), end=" ")
    best = {}
    for _ in range(5):
        for n, f in (("einsum", f1), ("mm", f2)):
            t = time.perf_counter(); [f() for _ in range(50)]; best[n] = min(best.get(n, 1e18), (time.perf_counter() - t) / 50 * 1e6)
    print((B, S, r, H, c), {k: round(v, 1) for k, v in best.items()})
