"""ExportableDecoderLM: a DecoderLM's decoding step with fixed-size KV caches as buffers, exported with torch.export:
fed a prompt token by token, the exported program gives the logits
of one full forward over the same tokens, in float64, for rotary and learned positions, grouped keys and a window;
it saves and loads; empty() starts a new sequence in an exported module, reset() in the eager one."""

from __future__ import annotations

import io

import pytest
import torch

from attnkit.models import DecoderLM, ExportableDecoderLM
from attnkit.models.config import DecoderConfig

B, CAPACITY = 2, 12


def _model(positional: str, window: int | None = None) -> DecoderLM:
    config = DecoderConfig(vocab_size=50, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_len=32,
                           positional=positional, norm="rmsnorm", mlp="swiglu", bias=False, window=window)
    torch.manual_seed(0)
    return DecoderLM(config).double().eval()


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 50, (B, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("positional, window", [
    pytest.param("rope", None, marks=pytest.mark.slow, id="rope"),
    pytest.param("learned", None, marks=pytest.mark.slow, id="learned"),
    pytest.param("rope", 3, marks=pytest.mark.slow, id="rope, window 3"),
])
def test_an_exported_step_fed_token_by_token_gives_the_full_forwards_logits(positional, window):
    model = _model(positional, window)
    ids = _ids(7)
    with torch.no_grad():
        want = model(ids).logits
        program = torch.export.export(ExportableDecoderLM(model, B, CAPACITY), (ids[:, :1],), strict=False)
        decode = program.module()
        got = torch.cat([decode(ids[:, i:i + 1]) for i in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_the_exported_step_saves_and_loads():
    model = _model("rope")
    ids = _ids(4)
    with torch.no_grad():
        want = model(ids).logits
        program = torch.export.export(ExportableDecoderLM(model, B, CAPACITY), (ids[:, :1],), strict=False)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        buffer.seek(0)
        decode = torch.export.load(buffer).module()
        got = torch.cat([decode(ids[:, i:i + 1]) for i in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_empty_starts_a_new_sequence_in_the_exported_module_and_reset_in_the_eager_one():
    """program.module()s share the program's buffers (torch.export's own state tensors): empty() zeroes the cache
    buffers only, and the next call is a first token again."""
    model = _model("rope")
    ids = _ids(3)
    step = ExportableDecoderLM(model, B, CAPACITY)
    with torch.no_grad():
        first = step(ids[:, :1])
        step(ids[:, 1:2])
        assert int(step.cache_0_next) == 2
        step.reset()
        assert int(step.cache_0_next) == 0 and not step.cache_0_keys.any()
        torch.testing.assert_close(step(ids[:, :1]), first, rtol=0, atol=0)
        step.reset()
        program = torch.export.export(step, (ids[:, :1],), strict=False)
        decode = program.module()
        torch.testing.assert_close(decode(ids[:, :1]), first, rtol=1e-12, atol=1e-12)
        decode(ids[:, 1:2])
        others = {n: b.clone() for n, b in decode.named_buffers() if not n.startswith("cache_")}
        ExportableDecoderLM.empty(decode)
        assert others and all(torch.equal(others[n], b) for n, b in decode.named_buffers() if n in others)
        torch.testing.assert_close(decode(ids[:, :1]), first, rtol=1e-12, atol=1e-12)


def test_bad_arguments_are_named():
    model = _model("rope")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ExportableDecoderLM(model, 0, CAPACITY)
    with pytest.raises(ValueError, match="capacity"):
        ExportableDecoderLM(model, B, 0)
    with pytest.raises(TypeError, match="model must be an attnkit DecoderLM"):
        ExportableDecoderLM(torch.nn.Linear(2, 2), B, CAPACITY)
    with pytest.raises(ValueError, match="no cache_"):
        ExportableDecoderLM.empty(model)


def test_a_step_built_under_inference_mode_runs_and_exports_outside_it():
    """Its caches are ordinary tensors whatever mode built it: written in place outside inference_mode, exported."""
    model = _model("learned")
    ids = _ids(2)
    with torch.inference_mode():
        step = ExportableDecoderLM(model, B, CAPACITY)
    assert not step.cache_0_keys.is_inference()
    with torch.no_grad():
        want = model(ids).logits
        got = torch.cat([step(ids[:, :1]), step(ids[:, 1:2])], dim=1)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        step.reset()
        with torch.inference_mode():  # and called under it
            torch.testing.assert_close(step(ids[:, :1]), want[:, :1], rtol=1e-10, atol=1e-10)
