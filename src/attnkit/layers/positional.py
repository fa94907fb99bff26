"""Positional encodings: sinusoidal, learned, rotary (RoPE) and ALiBi.

- Sinusoidal (Vaswani et al. 2017, section 3.5):
  PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)), base = 10000.
- Learned absolute positions (BERT, GPT-2).
- Rotary (Su et al. 2021, RoFormer): rotate each pair of query/key features by pos * theta_i,
  theta_i = base^(-2i/E); scores then depend on relative position only.
- ALiBi (Press et al. 2022): add -m_h * (distance) to the scores of head h, with geometric
  slopes m_h.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional import kept
from ..functional import masks as _masks
from ..functional.checks import check_int, check_rank
from ..functional.precision import accumulation_dtype
from ..functional.tracing import may_keep

__all__ = [
    "sinusoidal_table",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "yarn_mscale",
    "apply_rotary",
    "alibi_slopes",
    "alibi_bias",
    "ALiBi",
]


def sinusoidal_table(length: int, dim: int, base: float = 10000.0, *, device=None, dtype=None) -> Tensor:
    """(length, dim) table of the Vaswani sinusoids; even columns sin, odd columns cos."""
    if length < 0 or dim < 1:
        raise ValueError(f"length must be >= 0 and dim >= 1, got length={length}, dim={dim}")
    position = torch.arange(length, device=device, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, device=device, dtype=torch.float64)
    angle = position / base ** (two_i / dim)  # (length, ceil(dim/2))
    table = torch.empty(length, dim, device=device, dtype=torch.float64)
    table[:, 0::2] = angle.sin()
    table[:, 1::2] = angle.cos()[:, : dim // 2]
    return table.to(dtype or torch.get_default_dtype())


def rotation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype positions are computed in for a model of ``dtype``: at least float32 (half types
    rotate in float32, as transformers does) and at least the model's own (float64 stays float64)."""
    return accumulation_dtype(dtype)


def _check_positions(x: Tensor, offset: int, max_len: int) -> None:
    check_rank("x", x, 3, "(B, L, D)")
    if offset < 0 or offset + x.shape[1] > max_len:
        raise ValueError(
            f"positions [{offset}, {offset + x.shape[1]}) exceed max_len={max_len}; raise max_len"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding to (B, L, D) embeddings; no parameters."""

    def __init__(self, d_model: int, max_len: int = 4096, base: float = 10000.0):
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.base = base
        self.register_buffer("table", sinusoidal_table(max_len, d_model, base, dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts floating buffers; the table stays float32 (recomputed, not re-cast
        # from a rounded copy) so that a bf16 model adds the same positions as a float32 one.
        super()._apply(fn, recurse)
        self.table = sinusoidal_table(self.max_len, self.d_model, self.base, device=self.table.device,
                                      dtype=torch.float32)
        return self

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, L, D) -> x + PE[offset : offset + L]."""
        _check_positions(x, offset, self.max_len)
        if x.dtype == torch.float64:  # a float64 model gets float64 sinusoids, not float32 ones upcast
            rows = sinusoidal_table(offset + x.shape[1], self.d_model, self.base, device=x.device, dtype=torch.float64)
            return x + rows[offset:]
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned (max_len, D) position embedding to (B, L, D) embeddings (BERT, GPT-2)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_positions(x, offset, self.max_len)
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        return x + self.embedding(positions)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate feature pairs of x (..., L, E) by angles with cos/sin of shape (..., L, E/2).

    ``interleaved=False`` pairs feature i with i + E/2 (GPT-NeoX, Hugging Face Llama);
    ``interleaved=True`` pairs 2i with 2i+1 (RoFormer, GPT-J, Meta's Llama checkpoints).
    """
    return _rotate(x, *_full_width(cos, sin, interleaved), interleaved)


def _full_width(cos: Tensor, sin: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    """(..., E/2) cos and sin as the (..., E) factors of :func:`_rotate`: each feature's cos, and
    its partner's sin with the sign the rotation gives it."""
    if interleaved:
        return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor, interleaved: bool) -> Tensor:
    """x * cos + partner(x) * signed_sin: for a pair (x1, x2), (x1 cos - x2 sin, x2 cos + x1 sin),
    bit for bit (a + (-b) is a - b in floating point), in four elementwise kernels. The halves' partners
    [x2 ; x1] are x rolled by half its width: one op where chunk and cat are two (2 us of a 6 us rotation
    on a decoding step's tiny tensors)."""
    if interleaved:
        partner = torch.stack((x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        partner = x.roll(x.shape[-1] // 2, -1)
    return x * cos + partner * signed_sin


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) for (B, H, L, E) queries or keys.

    Args:
        head_dim: E, even.
        base: theta_i = base^(-2i/E); 10000 in RoFormer and Llama 2, 500000 in Llama 3, 100000 in SmolLM2.
        rotary_dim: rotate only the first rotary_dim of the E dims (GPT-NeoX's and Qwen3-Next's partial
            rotary factor), the frequencies theta_i = base^(-2i/rotary_dim); default all E.
        interleaved: pair layout, see :func:`apply_rotary`.
        scaling: context extension of the frequencies: None; ``"linear"`` (position interpolation,
            Chen et al. 2023: every theta_i / factor); ``"llama3"`` (Llama 3.1: wavelengths longer
            than original_max_len / low_freq_factor are divided by factor, shorter than
            original_max_len / high_freq_factor kept, the band between interpolated smoothly);
            ``"yarn"`` (Peng et al. 2023, DeepSeek-V2/V3: frequencies that turn fewer than ``beta_slow``
            times over original_max_len interpolated by factor, more than ``beta_fast`` times kept, a
            linear ramp between, and cos and sin multiplied by ``attention_factor``, by default
            0.1 ln(factor) + 1, or mscale's ratio where ``mscale`` and ``mscale_all_dim`` are given, as
            transformers computes it).
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        *,
        interleaved: bool = False,
        scaling: str | None = None,
        factor: float = 1.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_max_len: int = 8192,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        attention_factor: float | None = None,
        truncate: bool = True,
        rotary_dim: int | None = None,
    ):
        super().__init__()
        if rotary_dim is not None:
            check_int("rotary_dim", rotary_dim, 2, head_dim)
            if rotary_dim % 2:
                raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
        self.full_dim = head_dim  # the head's width; the frequencies are those of the rotated part
        head_dim = head_dim if rotary_dim is None else rotary_dim
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
        if not base > 1:
            raise ValueError(f"base must be > 1, got {base}")
        if scaling not in (None, "linear", "llama3", "yarn"):
            raise ValueError(f"scaling must be None, 'linear', 'llama3' or 'yarn', got {scaling!r}")
        if not factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {factor!r}")
        self.head_dim = head_dim
        self.base = base
        self.interleaved = interleaved
        self.scaling = scaling
        self.factor = float(factor)
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.original_max_len = original_max_len
        self.beta_fast, self.beta_slow, self.truncate = float(beta_fast), float(beta_slow), bool(truncate)
        self.attention_factor = 1.0 if scaling != "yarn" else _yarn_attention_factor(self.factor, mscale, mscale_all_dim,
                                                                                      attention_factor)
        self.register_buffer("inv_freq", self._frequencies(None), persistent=False)
        # (cos, sin) of positions 0.. (full width): a table of this module's own, not of any input. The
        # factors of explicit positions are kept beside the positions for one model call instead (the
        # layers of a model share one RotaryEmbedding: 24 computations a decoding step of a 12-layer
        # model, one with that).
        self._cached: tuple[Tensor, Tensor] | None = None
        self._last_slice: tuple | None = None  # (offset, L, dtype, device, cos, sin): _slice's last answer

    def _frequencies(self, device, dtype: torch.dtype = torch.float32) -> Tensor:
        """theta_i = base^(-2i/E) in ``dtype`` (computed in float64)."""
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim
        inv_freq = 1.0 / self.base**exponent
        if self.scaling == "linear":
            inv_freq = inv_freq / self.factor
        elif self.scaling == "llama3":
            wavelength = 2 * math.pi / inv_freq
            low_freq_wavelength = self.original_max_len / self.low_freq_factor
            high_freq_wavelength = self.original_max_len / self.high_freq_factor
            smooth = (self.original_max_len / wavelength - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            interpolated = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
            inv_freq = torch.where(
                wavelength > low_freq_wavelength,
                inv_freq / self.factor,
                torch.where(wavelength < high_freq_wavelength, inv_freq, interpolated),
            )
        elif self.scaling == "yarn":
            inv_freq = self._yarn(inv_freq)
        return inv_freq.to(dtype)

    def _yarn(self, inv_freq: Tensor) -> Tensor:
        """YaRN's frequencies: interpolated (theta / factor) below the correction range, kept above it,
        a linear ramp over its dimensions between (transformers' ``_compute_yarn_parameters``)."""
        dim, base, original = self.head_dim, self.base, self.original_max_len

        def correction_dim(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high = high + 0.001 if low == high else high  # no zero-width ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: the frequency extrapolates (kept); 0: it is interpolated
        return inv_freq / self.factor * (1 - keep) + inv_freq * keep

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts floating buffers: keep the frequencies float32 whatever the model's
        # dtype (recomputed, never re-cast from a rounded copy), and drop cos/sin computed before, so
        # the numbers do not depend on the dtype or on what ran before the cast.
        super()._apply(fn, recurse)
        self.inv_freq = self._frequencies(self.inv_freq.device)
        self._cached = self._last_slice = None
        return self

    def _table(self, length: int, device, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """:func:`_rotate`'s factors for positions 0 .. >= length-1 in ``dtype``, computed once per
        device and dtype and grown by doubling (decoding one token at a time would otherwise
        recompute them in every layer at every step)."""
        cached = self._cached
        if (cached is None or cached[0].shape[0] < length or cached[0].dtype != dtype
                or cached[0].device != (device if isinstance(device, torch.device) else torch.device(device))):
            size = max(length, 2 * (0 if cached is None else cached[0].shape[0]), 256)
            angles = self.angles(torch.arange(size, device=device), dtype=dtype)
            cached = self._cached = _full_width(*angles, self.interleaved)
        return cached

    def _slice(self, offset: int, L: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The table's rows offset .. offset+L-1. The last answer is kept: the layers that share this embedding
        rotate their queries and keys at the same positions in one decoding step (eight slices a step of four
        layers, each a view op and host time, become one pair). Where nothing may be kept (:func:`may_keep`: a
        compiled or exported graph, a fake tensor, CUDA-graph capture) the rows are computed afresh, with the same
        numbers, and neither the table nor the last answer is read or written."""
        if not may_keep(device):  # compiling, exporting, a fake tensor mode, CUDA-graph capture: nothing kept or read
            return _full_width(*self.angles(torch.arange(offset, offset + L, device=device), dtype), self.interleaved)
        last = self._last_slice
        if last is not None and last[0] == offset and last[1] == L and last[2] is dtype and last[3] == device:
            return last[4], last[5]
        if torch.is_inference_mode_enabled():
            # the table and its slices outlive this call: made under inference_mode they would be inference
            # tensors, which a later call under autograd cannot save for its backward (training after an
            # evaluation under inference_mode); built as ordinary tensors they serve both
            with torch.inference_mode(False):
                return self._slice(offset, L, device, dtype)
        cos, sin = self._table(offset + L, device, dtype)
        cos, sin = cos[offset : offset + L], sin[offset : offset + L]
        self._last_slice = (offset, L, dtype, device, cos, sin)
        return cos, sin

    def _factors(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """:func:`_rotate`'s factors for explicit positions, built once per model call for the layers that
        share this rotary embedding (:mod:`attnkit.functional.kept`); positions rewritten between calls are
        read afresh."""
        return kept.get(positions, ("rotary", id(self), dtype), lambda: self._explicit_factors(positions, dtype))

    def _explicit_factors(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cos, sin = _full_width(*self.angles(positions, dtype), self.interleaved)
        if cos.dim() == 3:  # (B, L, E) -> (B, 1, L, E): one table per row, shared by the heads
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    def angles(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin of positions (L,) or (B, L) times theta: (..., L, E/2), in float32 (as
        transformers computes them) or in float64 for a float64 model (never below the model)."""
        dtype = rotation_dtype(dtype)
        inv_freq = self.inv_freq if dtype == torch.float32 else self._frequencies(positions.device, dtype)
        angle = positions.to(dtype)[..., None] * inv_freq.to(device=positions.device, dtype=dtype)
        if self.attention_factor != 1.0:  # YaRN scales cos and sin themselves
            return angle.cos() * self.attention_factor, angle.sin() * self.attention_factor
        return angle.cos(), angle.sin()

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate x (B, H, L, E) for positions offset .. offset+L-1, or explicit (L,)/(B, L) positions."""
        check_rank("x", x, 4, "(B, H, L, E)")
        if x.shape[-1] != self.full_dim:
            raise ValueError(f"x has head dim {x.shape[-1]}, this RotaryEmbedding has head_dim={self.full_dim}")
        if self.full_dim != self.head_dim:  # partial: the first head_dim dims rotated, the rest as they are
            rotated, kept = x.split([self.head_dim, self.full_dim - self.head_dim], dim=-1)
            return torch.cat([self._rotated(rotated, offset, positions), kept], dim=-1)
        return self._rotated(x, offset, positions)

    def _rotated(self, x: Tensor, offset: int, positions: Tensor | None) -> Tensor:
        L = x.shape[2]
        work = rotation_dtype(x.dtype)
        if positions is None:
            cos, sin = self._slice(offset, L, x.device, work)
        elif positions.shape[-1] != L or positions.dim() not in (1, 2):
            raise ValueError(f"positions must have shape (L,) or (B, L) with L={L}, got {tuple(positions.shape)}")
        else:
            cos, sin = self._factors(positions, work)
        if x.dtype == work:  # no cast to call (each call costs host time when decoding on a GPU)
            return _rotate(x, cos, sin, self.interleaved)
        return _rotate(x.to(work), cos, sin, self.interleaved).to(x.dtype)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude scale 0.1 mscale ln(factor) + 1 (1 for factor <= 1); DeepSeek-V2/V3 also
    multiply their softmax scale by its square (``mscale_all_dim``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_attention_factor(factor: float, mscale, mscale_all_dim, attention_factor) -> float:
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def alibi_slopes(num_heads: int) -> Tensor:
    """(H,) ALiBi slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n = H a power of two;
    otherwise those of the closest smaller power of two followed by every other slope of twice
    that (Press et al. 2022, and their reference code)."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, L: int, S: int, *, causal_align: str = "bottom-right", symmetric: bool = False) -> Tensor:
    """(1, H, L, S) ALiBi bias: -m_h * (i + offset - j) (causal), or -m_h * |i + offset - j|
    with ``symmetric=True`` for bidirectional encoders. Pass it as ``bias=`` to attention."""
    offset = _masks.causal_offset(L, S, causal_align)
    distance = torch.arange(L, device=slopes.device)[:, None] + offset - torch.arange(S, device=slopes.device)[None, :]
    if symmetric:
        distance = distance.abs()
    return -slopes[None, :, None, None] * distance.to(slopes.dtype)


class ALiBi(nn.Module):
    """ALiBi bias generator for ``num_heads`` heads; forward(L, S) -> (1, H, L, S)."""

    slopes: Tensor

    def __init__(self, num_heads: int, *, symmetric: bool = False):
        super().__init__()
        self.symmetric = symmetric
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, L: int, S: int, *, causal_align: str = "bottom-right") -> Tensor:
        return alibi_bias(self.slopes, L, S, causal_align=causal_align, symmetric=self.symmetric)
