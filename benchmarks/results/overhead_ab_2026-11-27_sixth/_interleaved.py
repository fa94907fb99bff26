"""The timer of this folder's measurement scripts (each runs from here, ``python mha_plain_pieces.py``): variants
timed in alternating rounds in one process, each round's calls after a short warm-up, the best round kept."""
import time

import torch


def best_us(variants: dict, calls: int = 200, rounds: int = 30) -> dict:
    """Microseconds a call of each variant: ``name -> fn`` or ``name -> (setup, fn, teardown)`` (a patch that
    stands for a piece of the code, applied only around that variant's rounds). Printed as a table; returned."""
    best = dict.fromkeys(variants, float("inf"))
    with torch.no_grad():
        for _ in range(rounds):
            for name, variant in variants.items():
                setup, fn, teardown = variant if isinstance(variant, tuple) else (None, variant, None)
                if setup:
                    setup()
                try:
                    for _ in range(max(1, calls // 10)):
                        fn()
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
                finally:
                    if teardown:
                        teardown()
    for name, us in best.items():
        print(f"{name:48s} {us:8.2f} us", flush=True)
    return best
