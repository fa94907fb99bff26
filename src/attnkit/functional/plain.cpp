// attnkit's one compiled piece (attnkit.functional.compiled builds it: `attnkit build-ext`), two things:
// - plain(): the twin of plain.py's one_head_shape and nan.py's cpu_plain_output for their common case, so that a
//   tiny CPU call pays for its checks and the NaN rule's look in C++ rather than in Python. attention() calls it only
//   for a plain CPU call of plain tensors, uncompiled, under the NaN rule (nothing asked but q, k, v, is_causal and
//   causal_align); it answers None under autocast, a torch.func transform or a torch function mode (torch._C's
//   questions for Python, asked here in nanoseconds);
// - holds_nan(): nan.py's look at a CPU tensor, a scan of the elements' bits, where torch.equal(x, x) spent 1.7 us
//   setting up for 2,048 of them.
// Measured: benchmarks/results/overhead_ab_2026-11-28_fifteenth/. tests/functional/test_compiled.py holds both to the
// Python path's outputs, errors and NaN rows.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>

#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

// plain_look_min_keys(dtype) from nan.py for float64, float32, bfloat16 and float16, set by configure() when nan.py
// loads this module; until then no look settles anything (the Python side decides every call).
std::array<int64_t, 4> min_keys{INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};

int dtype_slot(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return 0;
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: return -1;
  }
}

void configure(std::vector<int64_t> keys) {
  TORCH_CHECK(keys.size() == 4, "configure takes four min_keys (float64, float32, bfloat16, float16), got ",
              keys.size());
  std::copy(keys.begin(), keys.end(), min_keys.begin());
}

// Whether the n elements from data, floats of `bytes` bytes (8, 4 or 2 with `bfloat` for bfloat16), hold a NaN:
// every element's bits compared as integers (a NaN's exponent is all ones and its mantissa not zero), SSE2 lanes
// on x86-64 and one element at a time elsewhere; no floating-point compare, so no flag or trap is raised.
bool scan_for_nan(const void* data, int64_t n, int bytes, bool bfloat) {
  const char* at = static_cast<const char*>(data);
  int64_t i = 0;
  if (bytes == 4) {
#if defined(__SSE2__)
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff), infinity = _mm_set1_epi32(0x7f800000);
    __m128i seen = _mm_setzero_si128();
    for (; i + 4 <= n; i += 4) {
      const __m128i word = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 4 * i));
      seen = _mm_or_si128(seen, _mm_cmpgt_epi32(_mm_and_si128(word, magnitude), infinity));
    }
    if (_mm_movemask_epi8(seen)) return true;
#endif
    for (; i < n; ++i) {
      int32_t word;
      std::memcpy(&word, at + 4 * i, 4);
      if ((word & 0x7fffffff) > 0x7f800000) return true;
    }
    return false;
  }
  if (bytes == 2) {
    const int16_t infinity = bfloat ? 0x7f80 : 0x7c00;
#if defined(__SSE2__)
    const __m128i magnitude = _mm_set1_epi16(0x7fff), limit = _mm_set1_epi16(infinity);
    __m128i seen = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      const __m128i word = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 2 * i));
      seen = _mm_or_si128(seen, _mm_cmpgt_epi16(_mm_and_si128(word, magnitude), limit));
    }
    if (_mm_movemask_epi8(seen)) return true;
#endif
    for (; i < n; ++i) {
      int16_t word;
      std::memcpy(&word, at + 2 * i, 2);
      if ((word & 0x7fff) > infinity) return true;
    }
    return false;
  }
  for (; i < n; ++i) {  // float64: 2 lanes of SSE2 would gain little at these sizes
    int64_t word;
    std::memcpy(&word, at + 8 * i, 8);
    if ((word & 0x7fffffffffffffffLL) > 0x7ff0000000000000LL) return true;
  }
  return false;
}

// The most elements of each dtype scanned rather than reduced with the (threaded, vectorised) maximum: where the two
// cost the same (float32 16K, float64 2K elements); the 16-bit types' scan was faster at every size measured, up to
// 1M (benchmarks/results/overhead_ab_2026-11-28_fifteenth/scan_sizes.txt).
int64_t scan_limit(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 16384;
    case at::kDouble: return 2048;
    case at::kBFloat16:
    case at::kHalf: return INT64_MAX;
    default: return -1;
  }
}

// Whether x's elements lie in CPU memory this code may read: not a Python subclass (FakeTensor, whose storage is
// meta, among them), a functorch wrapper or a tensor without storage, which go through torch's own ops.
bool readable(const at::Tensor& x) {
  return x.is_cpu() && !x.key_set().has(c10::DispatchKey::Python) && !x.key_set().has_any(c10::functorch_transforms_ks)
         && x.has_storage() && x.const_data_ptr() != nullptr;
}

// nan.py's holds_nan for a CPU tensor: its elements scanned where they lie densely (in any order of dimensions) and
// there are few enough, else the maximum, which carries any NaN.
bool holds_nan(const at::Tensor& x) {
  if (x.numel() == 0) return false;  // (nothing to hold a NaN, and no maximum)
  if (x.numel() <= scan_limit(x.scalar_type()) && x.is_non_overlapping_and_dense() && readable(x)) {
    return scan_for_nan(x.const_data_ptr(), x.numel(), static_cast<int>(x.element_size()),
                        x.scalar_type() == at::kBFloat16);
  }
  return std::isnan(x.amax().item<double>());
}

// Whether a look at SDPA's output settles the NaN rule, and it shows no NaN (nan.py: cpu_plain_output's first branch).
bool clean(const at::Tensor& output, int64_t L, int64_t S, bool is_causal) {
  const int slot = dtype_slot(output.scalar_type());
  if (slot < 0 || (is_causal && L < S) || S < min_keys[slot]) return false;
  return !holds_nan(output);
}

}  // namespace

// Whether `text` is the Python string `expected`.
bool is(py::handle text, const char* expected) {
  return PyUnicode_Check(text.ptr()) && PyUnicode_CompareWithASCIIString(text.ptr(), expected) == 0;
}

// None under autocast, a transform or a function mode, where q (B, H, L, E), k and v (B, H, S, E) do not share batch,
// heads and head dim or a size is zero, and where the causal alignment needs a mask or is not one (the checked path
// decides: plain.py's plain_causal); else SDPA's output where the look settles the rule, or (output, causal) where
// nan.cpu_plain_output must finish it (a NaN seen, or a call the look does not settle).
py::object plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal, py::handle causal_align) {
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (!tls.excluded_.isSupersetOf(c10::autocast_dispatch_keyset) ||  // torch._C._is_any_autocast_enabled()
      tls.included_.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||  // _are_functorch_transforms_active()
      at::impl::torch_function_mode_enabled()) {  // _is_torch_function_mode_enabled()
    return py::none();
  }
  if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 4 || k.dim() != 4 || !k.sizes().equals(v.sizes())) {
    return py::none();
  }
  const auto qs = q.sizes();
  const auto ks = k.sizes();
  if (qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] || qs[0] == 0 || qs[1] == 0 || qs[2] == 0 || ks[2] == 0 ||
      qs[3] == 0) {
    return py::none();
  }
  if (!is(causal_align, "top-left")) {  // bottom-right: top-left where L = S, no mask for one query
    if (!is(causal_align, "bottom-right") || (is_causal && qs[2] != ks[2] && qs[2] != 1)) return py::none();
    is_causal = is_causal && qs[2] == ks[2];
  }
  at::Tensor output;
  bool settled;
  {
    py::gil_scoped_release no_gil;  // as torch's own bindings do around an op
    output = at::scaled_dot_product_attention(q, k, v, {}, 0.0, is_causal);
    settled = clean(output, qs[2], ks[2], is_causal);
  }
  if (settled) return py::cast(output);
  return py::make_tuple(output, is_causal);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("configure", &configure, "the NaN rule's look thresholds per dtype (float64, float32, bfloat16, float16)");
  m.def("holds_nan", &holds_nan, "whether a non-empty CPU tensor holds a NaN (nan.holds_nan)", py::arg("x"));
  m.def("plain", &plain, "a plain CPU call's SDPA output with the NaN rule's look", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("is_causal"), py::arg("causal_align"));
}
