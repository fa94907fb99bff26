"""The timer of this folder's piece scripts (``masked_pieces.py``, ``look_alternatives.py``): each function timed
alone, the functions in a fresh random order every round, the best round's mean kept. (The sixth session's folder
has its own, ``_interleaved.py``: a fixed order with a warm-up and patches around a variant.)"""

import math
import random
import time


def best_us(functions: dict, calls: int, rounds: int = 40) -> dict:
    """Microseconds a call of each ``name -> fn``: ``rounds`` rounds of ``calls`` calls each, the best kept."""
    best = dict.fromkeys(functions, math.inf)
    for _ in range(rounds):
        for name, function in random.sample(list(functions.items()), len(functions)):
            start = time.perf_counter()
            for _ in range(calls):
                function()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best
