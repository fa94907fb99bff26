"""What attnkit's native Mamba-2 (``attnkit.models.mamba2``) adds to the checks every Mamba-2 model passes
(test_hf_mamba2_hybrids.py): config keys it does not implement refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")

from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import (  # noqa: E402
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    config = tiny_config("mamba2")
    theirs, folder = saved_checkpoint(lambda: transformers.Mamba2ForCausalLM(config))
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_key_attnkit_does_not_implement_is_refused(checkpoint, tmp_path):
    _, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    config["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="hidden_act"):
        load_hf_folder(tmp_path)
    config["hidden_act"], config["num_heads"] = "silu", 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="num_heads x head_dim"):
        load_hf_folder(tmp_path)
