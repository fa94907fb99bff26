"""py-spy's raw samples (``-f raw``: one line a stack, frames separated by ';', then a count) in percent of the
samples whose stack holds KEY: by innermost line (self), then by function (inclusive).

    python pyspy_by_line.py RAW_FILE KEY HOW_MANY
"""
import sys
from collections import Counter

own: Counter = Counter()
inclusive: Counter = Counter()
total = 0
path, key, how_many = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path) as raw:
    for line in raw:
        stack, count = line.rstrip().rsplit(" ", 1)
        if key not in stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        functions = {f.split(" (")[0] + " " + f.split(" (")[1].split(":")[0] if " (" in f else f for f in frames}
        for function in functions:
            inclusive[function] += n
print("total", total)
for frame, n in own.most_common(how_many):
    print(f"{100 * n / total:5.1f}% {frame}")
print("--- inclusive")
for function, n in inclusive.most_common(how_many):
    print(f"{100 * n / total:5.1f}% {function}")
