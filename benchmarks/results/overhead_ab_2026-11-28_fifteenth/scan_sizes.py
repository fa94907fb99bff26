"""The compiled NaN look's two ways, timed at sizes from 4K to 1M elements (float32, bfloat16, float64; one and two
threads): the scan of the elements' bits (plain.cpp's scan_for_nan, compiled here from the source) against the
maximum (``amax``, threaded and vectorised), each called from C++. Where the scan stops: plain.cpp's scan_limit.

    .venv/bin/python benchmarks/results/overhead_ab_2026-11-28_fifteenth/scan_sizes.py
"""
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

source = (Path(__file__).parents[3] / "src/attnkit/functional/plain.cpp").read_text()
scan = source[source.index("// Whether the n elements"):source.index("// The most elements of each dtype")]
module = load_inline("attnkit_scan_sizes", cpp_sources=["""#include <torch/extension.h>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
""" + scan + """
bool scan(const at::Tensor& x) {
  return scan_for_nan(x.const_data_ptr(), x.numel(), x.element_size(), x.scalar_type() == at::kBFloat16);
}
bool maximum(const at::Tensor& x) { return std::isnan(x.amax().item<double>()); }
"""], functions=["scan", "maximum"], extra_cflags=["-O2"])

print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}; microseconds, best of 7 rounds of 200")
for threads in (1, 2):
    torch.set_num_threads(threads)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        row = []
        for n in (4096, 16384, 65536, 262144, 1048576):
            x = torch.randn(n).to(dtype)
            best = {}
            for name, look in (("scan", module.scan), ("amax", module.maximum)):
                rounds = []
                for _ in range(7):
                    start = time.perf_counter()
                    for _ in range(200):
                        look(x)
                    rounds.append((time.perf_counter() - start) / 200 * 1e6)
                best[name] = min(rounds)
            row.append(f"{n}: scan {best['scan']:.2f} amax {best['amax']:.2f}")
        print(threads, dtype, " | ".join(row))
