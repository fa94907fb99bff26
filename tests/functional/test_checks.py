"""The shared input checks (attnkit.functional.checks): messages name the argument, what was
expected and what was given."""

from __future__ import annotations

import pytest


def test_check_int_is_the_one_integer_check():
    from attnkit.functional.checks import check_int

    assert check_int("window", 3, 1) == 3
    assert check_int("window", None, 1, optional=True) is None
    for value, message in [(0, "window must be a positive int, got 0"), (2.0, "window must be a positive int, got 2.0"),
                           (True, "window must be a positive int, got True"), ("3", "window must be a positive int, got '3'")]:
        with pytest.raises(ValueError, match=message):
            check_int("window", value, 1)
    with pytest.raises(ValueError, match=r"seq must be an int in \[1, 10\], got 11"):
        check_int("seq", 11, 1, 10)
    with pytest.raises(ValueError, match="sinks must be a non-negative int or None, got -1"):
        check_int("sinks", -1, 0, optional=True)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"need_weights": 0}, TypeError, r"need_weights must be True, False or a sequence of head indices in \[0, 2\), got int 0"),
    ({"need_weights": None}, TypeError, r"need_weights must be .*got NoneType None"),
    ({"need_weights": "01"}, TypeError, r"need_weights must be .*got str '01'"),
    ({"need_weights": [2]}, ValueError, r"need_weights must be a bool or a non-empty sequence of head indices"),
    ({"dropout_p": None}, ValueError, r"dropout_p must be a number in \[0, 1\), got None"),
    ({"dropout_p": True}, ValueError, r"dropout_p must be a number in \[0, 1\), got True"),
    ({"dropout_p": 1.0}, ValueError, r"dropout_p must be a number in \[0, 1\), got 1.0"),
])
def test_attention_names_bad_weights_and_dropout_arguments(kwargs, error, message):
    """They ended in bare TypeErrors from list() and a comparison with None."""
    import torch

    import attnkit

    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(error, match=message):
        attnkit.attention(q, q, q, **kwargs)


def test_device_type_is_the_devices_own_type_kept_per_device():
    """functional.devices.device_type answers what torch.device.type does, for devices never seen before too,
    and a device of another index or kind is not served another's answer."""
    import torch

    from attnkit.functional.devices import device_type

    for name in ["cpu", "meta", "cuda", "cuda:1", "cuda:0", "xpu:3", "cpu"]:
        device = torch.device(name)
        assert device_type(device) == device.type == name.split(":")[0]
    assert device_type(torch.device("cuda", 1)) == "cuda"
