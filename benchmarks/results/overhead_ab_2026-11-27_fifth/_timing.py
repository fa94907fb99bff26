"""The timer of this folder's measurement scripts (each runs from here: ``python look_cost.py``)."""
import time


def t(name, f, n=4000, r=15):
    """Print the best of ``r`` rounds of ``n`` calls of ``f``: microseconds a call."""
    best = 1e9
    for _ in range(r):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    print(f"{name:40s} {best * 1e6:7.2f} us", flush=True)
