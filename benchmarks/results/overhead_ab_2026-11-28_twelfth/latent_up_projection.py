"""LatentAttention's per-head up-projection: einsum("bosr,hcr->bhsc") against the one (B S, r) x (r, H c) product the
layer writes out (torch.export takes the product's view with a dynamic length). Prints the largest difference, then
the best of 5 rounds' mean microseconds per call (50 calls a round), one process."""

import time

import torch


def per_call_us(function, calls: int = 50, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    torch.manual_seed(0)
    for B, S, r, H, c in ((1, 16, 64, 4, 24), (1, 512, 512, 16, 192), (4, 128, 256, 8, 96)):
        latent = torch.randn(B, 1, S, r)
        weights = torch.randn(H, c, r)

        def einsum(latent=latent, weights=weights):
            return torch.einsum("bosr,hcr->bhsc", latent, weights)

        def product(latent=latent, weights=weights, B=B, S=S, r=r, H=H):
            return (latent.reshape(B * S, r) @ weights.reshape(-1, r).T).view(B, S, H, -1).transpose(1, 2)

        difference = (einsum() - product()).abs().max().item()
        times = {"einsum": per_call_us(einsum), "mm": per_call_us(product)}
        print(difference, (B, S, r, H, c), {name: round(us, 1) for name, us in times.items()})


if __name__ == "__main__":
    main()
