// attnkit's plain call, compiled: the twin of plain.py's one_head_shape and nan.py's cpu_plain_output for their
// common case, so that a tiny CPU call pays for its checks and the NaN rule's look in C++ rather than in Python
// (benchmarks/results/overhead_ab_2026-11-28_fifteenth/). Built by attnkit.functional.compiled (`attnkit build-ext`);
// attention() calls it only for a plain CPU call of plain tensors, uncompiled, under the NaN rule (nothing asked but
// q, k, v, is_causal and causal_align); it answers None under autocast, a torch.func transform or a
// torch function mode (the questions torch._C answers for Python, asked here in nanoseconds), and
// tests/functional/test_compiled.py holds the two to the same outputs, errors and NaN rows.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>

#include <array>
#include <cmath>

namespace {

// plain_look_min_keys(dtype) and _SCANNED_UP_TO[dtype] from nan.py, for float64, float32, bfloat16 and float16
// (set once by configure(); another dtype is left to Python).
std::array<int64_t, 4> min_keys{-1, -1, -1, -1};
std::array<int64_t, 4> scanned_up_to{0, 0, 0, 0};

int dtype_slot(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return 0;
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: return -1;
  }
}

void configure(std::vector<int64_t> keys, std::vector<int64_t> scanned) {
  TORCH_CHECK(keys.size() == 4 && scanned.size() == 4, "configure takes four min_keys and four scanned_up_to");
  std::copy(keys.begin(), keys.end(), min_keys.begin());
  std::copy(scanned.begin(), scanned.end(), scanned_up_to.begin());
}

// Whether a look at SDPA's output settles the NaN rule, and it shows no NaN (nan.py: cpu_plain_output's first
// branch, with holds_nan's equal(x, x) scan for small tensors and the NaN-carrying maximum for larger ones).
bool clean(const at::Tensor& output, int64_t L, int64_t S, bool is_causal) {
  const int slot = dtype_slot(output.scalar_type());
  if (slot < 0 || (is_causal && L < S) || S < min_keys[slot]) return false;
  if (output.numel() <= scanned_up_to[slot]) return at::equal(output, output);
  return !std::isnan(output.amax().item<double>());
}

}  // namespace

// Whether `text` is the Python string `expected`.
bool is(py::handle text, const char* expected) {
  return PyUnicode_Check(text.ptr()) && PyUnicode_CompareWithASCIIString(text.ptr(), expected) == 0;
}

// None under autocast, a transform or a function mode, where q (B, H, L, E), k and v (B, H, S, E) do not share batch,
// heads and head dim or a size is zero, and where the causal alignment needs a mask or is not one (the checked path
// decides: plain.py's plain_causal); else SDPA's output where the look settles the rule, or (output, nan_seen,
// causal) where Python must finish it (a NaN seen: the poisoned rows; or the look does not apply:
// nan.cpu_plain_output).
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
  const int slot = dtype_slot(output.scalar_type());
  const bool looked = slot >= 0 && !(is_causal && qs[2] < ks[2]) && ks[2] >= min_keys[slot];
  return py::make_tuple(output, looked, is_causal);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("configure", &configure, "the NaN rule's look thresholds per dtype (float64, float32, bfloat16, float16)");
  m.def("plain", &plain, "a plain CPU call's SDPA output with the NaN rule's look", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("is_causal"), py::arg("causal_align"));
}
