"""The linear layers' ``backend``: each hands it to the linear core on every call (read at the call, so that a loaded
model's layers can be set), and refuses a value outside the three by name. What each backend computes:
tests/functional/test_linear_kernels.py."""

from __future__ import annotations

import pytest
import torch

from attnkit.functional.linear import kernels
from attnkit.layers import GatedDeltaNet, KimiDeltaAttention, LightningAttention, Mamba2

LAYERS = {
    "GatedDeltaNet": lambda **kw: GatedDeltaNet(16, 2, 4, 4, 4, **kw),
    "KimiDeltaAttention": lambda **kw: KimiDeltaAttention(16, 2, 4, **kw),
    "LightningAttention": lambda **kw: LightningAttention(16, 2, 4, layer_idx=0, num_layers=2, **kw),
    "Mamba2": lambda **kw: Mamba2(16, 4, 4, 8, n_groups=2, **kw),
}


@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_refuses_a_backend_outside_the_three(name):
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'torch', 'fla', got 'cuda'"):
        LAYERS[name](backend="cuda")


@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_hands_its_backend_to_the_core_at_each_call(name, monkeypatch):
    layer = LAYERS[name](backend="torch")
    seen = []
    real = kernels.uses_fla

    def recorded(backend, *args):
        seen.append(backend)
        return real(backend, *args)

    monkeypatch.setattr("attnkit.functional.linear.delta.uses_fla", recorded)
    x = torch.randn(2, 9, 16)
    expected = layer(x).output
    assert seen and set(seen) == {"torch"}
    layer.backend = "auto"  # the CPU: attnkit's form again, the same numbers
    torch.testing.assert_close(layer(x).output, expected, rtol=0, atol=0)
    assert seen[-1] == "auto"
    monkeypatch.setattr(kernels, "fla_installed", lambda: False)
    layer.backend = "fla"
    with pytest.raises(ImportError, match=r"backend='fla' needs flash-linear-attention's kernels"):
        layer(x)
