"""Every value a native hybrid loader reads is checked when the folder is loaded: for every family, every key its
loader reads (``_READ``, with the kind of value each takes) x a value of the wrong type and one of the wrong size
is refused in one line naming the key and the config.json, before any tensor is read (the folder holds the
config alone). Beside them, what the tensors and the keys must agree on: a conv_kernel or a state size the tensors
do not have is named in one line, and the command line says each with exit status 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from attnkit.cli import main  # noqa: E402
from attnkit.models import falcon_h1, granite, kimi_linear, mamba2, minimax, nemotron_h, qwen3_next  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import tiny_config  # noqa: E402

READ = {"mamba2": mamba2._READ, "bamba": granite._READ["bamba"], "granitemoehybrid": granite._READ["granitemoehybrid"],
        "nemotron_h": nemotron_h._READ, "falcon_h1": falcon_h1._READ, "qwen3_next": qwen3_next._READ,
        "qwen3_5_text": qwen3_next._READ, "kimi_linear": kimi_linear._READ, "minimax": minimax._READ}
"""Each family's keys: the loaders' own table of what they read (every key there is tried below)."""

WRONG = {  # kind: (a value of the wrong type, values of the right type and the wrong size)
    "size": ("6", [0, -1, 2.5, True]),
    "count": ("2", [-1, 1.5]),
    "number": ("x", [math.inf]),
    "positive": ("1e-5", [0, -1.0]),
    "non-negative": ("1e-5", [-1e-5]),
    "flag": ("yes", [1]),
    "name": (7, [["silu"]]),
    "names": ("linear_attention", [[1]]),
    "numbers": ("1.0", [["x"]]),
    "indices": ("2", [[-1]]),
    "mapping": ("default", [[1]]),
    "limit": ("x", [[1.0, 0.5], [-1.0, 1.0], [0.0]]),
}


def _cases():
    for family, read in READ.items():
        for key, value in read.items():
            if key == "model_type":
                continue
            wrong_type, wrong_values = WRONG[value.kind]
            for wrong in [wrong_type, *wrong_values, *([] if value.nullable else [None])]:
                yield family, key, wrong


def test_every_key_of_every_family_has_a_kind_the_table_knows():
    kinds = {value.kind for read in READ.values() for value in read.values()}
    assert kinds <= set(WRONG), kinds - set(WRONG)
    assert sum(len(read) for read in READ.values()) > 250  # (all nine families' keys)


@pytest.mark.parametrize("family", list(READ))
def test_a_wrong_value_of_any_key_read_is_refused_in_one_line_naming_the_key_and_the_file(tmp_path, family):
    base = tiny_config(family).to_dict()
    path = tmp_path / "config.json"
    tried = 0
    for name, key, wrong in _cases():
        if name != family:
            continue
        path.write_text(json.dumps(base | {key: wrong}))
        with pytest.raises(UnsupportedConfigError) as info:
            load_hf_folder(tmp_path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        assert key in message and repr(wrong) in message, (key, wrong, message)
        tried += 1
    assert tried >= 3 * (len(READ[family]) - 1)


@pytest.mark.parametrize("family, key, value, words", [
    ("mamba2", "num_heads", "6", ["num_heads must be an integer >= 1, got '6'"]),
    ("mamba2", "hidden_size", "4096", ["hidden_size must be an integer >= 1, got '4096'"]),
    ("mamba2", "time_step_limit", [0.5, 0.1], ["time_step_limit must be [low, high] with 0 <= low <= high"]),
    ("nemotron_h", "ssm_state_size", -8, ["ssm_state_size must be an integer >= 1, got -8"]),
    ("qwen3_next", "linear_key_head_dim", 8.0, ["linear_key_head_dim must be an integer >= 1, got 8.0"]),
    ("falcon_h1", "ssm_multipliers", [1, 1, "x", 1, 1], ["ssm_multipliers must be a list of finite numbers"]),
    ("falcon_h1", "key_multiplier", "0.8", ["key_multiplier must be a finite number, got '0.8'"]),
])
def test_the_command_line_says_it_in_one_line_with_exit_status_2(tmp_path, capsys, family, key, value, words):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config(family).to_dict() | {key: value}))
    assert main(["cost", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(tmp_path / "config.json") in err, err
    for word in words:
        assert word in err, err


@pytest.mark.slow
@pytest.mark.parametrize("key, value, tensor", [("conv_kernel", 3, "conv1d.weight"), ("state_size", 4, "in_proj.weight")])
def test_sizes_the_tensors_do_not_have_are_named_in_one_line(tmp_path, key, value, tensor):
    """config.json's sizes against the tensors (torch's own message is many lines and names no key)."""
    from hybrid_checks import saved_checkpoint

    model, folder = saved_checkpoint(lambda: transformers.Mamba2ForCausalLM(tiny_config("mamba2")))
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {key: value}))
        with pytest.raises(Exception) as info:
            load_hf_folder(folder)
        message = str(info.value)
        assert "\n" not in message and "config.json's sizes" in message and tensor in message, message
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_nemotron_h_with_attention_bias_true_loads_as_transformers_reads_it(tmp_path):
    """transformers' Nemotron-H builds no attention biases whatever attention_bias says, so its folders hold none:
    the key is read as it reads it, and the logits are transformers'."""
    from hybrid_checks import assert_same_logits, saved_checkpoint

    theirs, folder = saved_checkpoint(
        lambda: transformers.NemotronHForCausalLM(tiny_config("nemotron_h", attention_bias=True)))
    folder = Path(folder)
    try:
        assert json.loads((folder / "config.json").read_text())["attention_bias"] is True
        assert_same_logits(load_hf_folder(folder), theirs, tol=2e-4)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def test_qwen3_next_with_an_odd_number_of_rotary_dims_is_refused_naming_both_keys(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("qwen3_next", head_dim=12).to_dict()))
    with pytest.raises(UnsupportedConfigError, match=r"head_dim x partial_rotary_factor = 12 x 0.25 gives 3 rotary dims"):
        load_hf_folder(tmp_path)
