"""The compiled plain call with its two looks, in one process, the forms alternating (B 1, H 4, L = S = 16, E 32,
float32, one thread; the best of 30 rounds of 3,000 calls): SDPA from Python, plain.cpp as it is (the bit scan),
and plain.cpp with its look replaced by ``at::equal(x, x)`` (the first form, first/).

    .venv/bin/python benchmarks/results/overhead_ab_2026-11-28_fifteenth/look_in_cpp.py
"""
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

import attnkit  # noqa: F401  (nan.py's thresholds)
from attnkit.functional import nan

folder = Path(__file__).parent / ".build"
folder.mkdir(exist_ok=True)
source = (Path(__file__).parents[3] / "src/attnkit/functional/plain.cpp").read_text()
scanned = "  if (x.is_cpu() && x.numel() <= scan_limit(x.scalar_type()) && x.is_non_overlapping_and_dense()) {"
assert scanned in source
forms = {"scan": source, "equal": source.replace(scanned, "  if (x.is_cpu()) return !at::equal(x, x);\n" + scanned)}
modules = {}
for name, text in forms.items():
    path = folder / f"look_{name}.cpp"
    path.write_text(text)
    modules[name] = load(f"attnkit_look_{name}", [str(path)], extra_cflags=["-O2"], build_directory=str(folder))
    modules[name].configure([nan.plain_look_min_keys(d) for d in (torch.float64, torch.float32, torch.bfloat16,
                                                                   torch.float16)])
torch.set_num_threads(1)
q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))
calls = {"SDPA": lambda: F.scaled_dot_product_attention(q, k, v)}
for name, module in modules.items():
    calls[f"plain.cpp, {name}"] = lambda plain=module.plain: plain(q, k, v, False, "top-left")
assert all(type(call()) is torch.Tensor for call in calls.values())
times = {name: [] for name in calls}
for _ in range(30):
    for name, call in calls.items():
        start = time.perf_counter()
        for _ in range(3000):
            call()
        times[name].append((time.perf_counter() - start) / 3000 * 1e6)
print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread; best of 30 rounds")
for name, values in times.items():
    print(f"{name:22s} {min(values):6.2f} us  {min(values) / min(times['SDPA']):.2f}x")
