"""A checkpoint save killed at any step of its swap leaves a loadable checkpoint, or recovers it on
the next start without help; stale temporaries are cleaned. The kill is simulated as kill -9 would
act: the code after the failing step (its clean-up included) never runs."""

from __future__ import annotations

import os

import pytest
import torch

from attnkit.models import Seq2SeqConfig, build_model
from attnkit.training import checkpoint as ckpt
from attnkit.training import load_checkpoint, save_checkpoint


class _Killed(BaseException):
    pass


def _model(seed: int, source, target):
    torch.manual_seed(seed)
    return build_model(Seq2SeqConfig(source_vocab=source.vocab_size, target_vocab=target.vocab_size, embedding_dim=8,
                                     hidden_size=8))


@pytest.mark.parametrize("step", range(4))  # the renames and deletions of the swap, killed at each one
def test_save_killed_at_every_step_of_the_swap_recovers_unaided(phrases, tmp_path, monkeypatch, step):
    _, _, _, source, target = phrases
    old, new = _model(1, source, target), _model(2, source, target)
    folder = save_checkpoint(tmp_path / "last", old, source, target, trainer={"progress": {}})
    calls = {"n": 0}
    real_replace, real_rmtree = os.replace, ckpt.shutil.rmtree
    killed = {"now": False}

    def counting(operation):
        def wrapped(*args, **kwargs):
            if killed["now"]:  # after the kill nothing runs: no clean-up either
                raise _Killed
            if calls["n"] == step:
                killed["now"] = True
                raise _Killed
            calls["n"] += 1
            return operation(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(ckpt.os, "replace", counting(real_replace))
    monkeypatch.setattr(ckpt.shutil, "rmtree", counting(real_rmtree))
    try:
        save_checkpoint(folder, new, source, target, trainer={"progress": {}})
    except _Killed:
        pass
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    loaded = load_checkpoint(folder)  # the next start: no manual mv
    weights = dict(loaded.model.state_dict())
    matches_old = all(torch.equal(weights[k], v) for k, v in old.state_dict().items())
    matches_new = all(torch.equal(weights[k], v) for k, v in new.state_dict().items())
    assert matches_old or matches_new
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last"]
    assert leftovers == [], leftovers
