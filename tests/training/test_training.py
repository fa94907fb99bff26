"""Training: a tiny model learns a generated task and its alignment; resume is bit-identical;
checkpoints are atomic and checked; warm-up schedule; metrics."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.decoding import translate
from attnkit.models import Seq2Seq, Seq2SeqConfig, TransformerConfig, TransformerEncoderDecoder
from attnkit.training import (
    CheckpointError,
    TrainingConfig,
    bleu_by_length,
    corpus_scores,
    load_checkpoint,
    save_checkpoint,
    train,
)


def _seq2seq(source, target, attention="luong-dot", **changes):
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=32, hidden_size=64,
                                 attention=attention, attention_dim=32, **({"dropout": 0.0} | changes)))


@pytest.mark.slow
def test_tiny_attention_model_learns_the_task_and_the_known_alignment(phrases, tmp_path):
    """Acceptance: >= 95% exact match and attention argmax on the gold source word for >= 90% of
    target words, trained on 2 CPU threads in well under a minute."""
    train_pairs, valid, test, source, target = phrases
    model = _seq2seq(source, target, bidirectional=False)
    train(model, source, target, train_pairs, valid, TrainingConfig(epochs=8, batch_size=32, lr=3e-3,
          label_smoothing=0.0, patience=0), tmp_path, progress=False, log=lambda _: None)
    outputs = translate(model, [p.source for p in test], source, target, beam_size=1)
    exact = sum(o.text == p.target for o, p in zip(outputs, test)) / len(test)
    agree = total = 0
    for output, pair in zip(outputs, test):
        if output.text != pair.target:
            continue  # the alignment of a wrong output has no gold standard
        for s, t in pair.alignment:  # word-level tokens: token index == word index
            agree += int(output.weights[t].argmax()) == s
            total += 1
    assert exact >= 0.95, f"exact match {exact:.3f}"
    assert agree / total >= 0.90, f"alignment agreement {agree / total:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seq2seq", "transformer"])
def test_resume_continues_bit_identically(phrases, tmp_path, kind):
    train_pairs, valid, _, source, target = phrases
    train_pairs = train_pairs[:400]

    def model():
        if kind == "seq2seq":
            return _seq2seq(source, target, attention="bahdanau", dropout=0.3)
        torch.manual_seed(0)
        return TransformerEncoderDecoder(TransformerConfig(source.vocab_size, target.vocab_size, d_model=32, num_heads=4,
                                                           d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.3))

    config = TrainingConfig(epochs=2, batch_size=32, lr=2e-3, warmup_steps=5, seed=3, patience=0)
    quiet = {"progress": False, "log": lambda _: None}
    whole = train(model(), source, target, train_pairs, valid, config, tmp_path / "whole", **quiet)
    first = train(model(), source, target, train_pairs, valid, TrainingConfig(**{**config.__dict__, "max_steps": 17}),
                  tmp_path / "split", **quiet)
    assert first.stopped == "max-steps" and first.steps == 17
    # The stop is validated (its weights may be the best), as a partial record; the epoch stays open.
    assert [(e["step"], e.get("partial", False)) for e in first.history["epochs"]][-1] == (17, True)
    assert first.epochs_done == 1
    fresh = model()  # resume restores weights, optimiser moments, RNG (dropout) and the batch position
    rest = train(fresh, source, target, train_pairs, valid, config, tmp_path / "split", resume=True, **quiet)
    assert rest.steps == whole.steps
    assert [s["loss"] for s in rest.history["steps"]] == [s["loss"] for s in whole.history["steps"]]
    assert rest.history["epochs"][-1]["valid_loss"] == whole.history["epochs"][-1]["valid_loss"]
    # Step 17 is halfway through epoch 2: its train loss still counts the batches before the stop.
    whole_epochs = [e for e in rest.history["epochs"] if not e.get("partial")]
    assert [e["train_loss"] for e in whole_epochs] == [e["train_loss"] for e in whole.history["epochs"]]
    ours, theirs = load_checkpoint(tmp_path / "split" / "last").model, load_checkpoint(tmp_path / "whole" / "last").model
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_round_trip_and_clear_errors(phrases, tmp_path):
    _, _, test, source, target = phrases
    model = _seq2seq(source, target, attention="bahdanau").eval()
    folder = save_checkpoint(tmp_path / "ckpt", model, source, target)
    loaded = load_checkpoint(folder)
    texts = [p.source for p in test[:5]]
    assert [o.text for o in translate(loaded.model, texts, source, target)] == [o.text for o in translate(model, texts, source, target)]
    assert not list(tmp_path.glob(".ckpt*")), "temporary folders left behind"
    # Saving again replaces the folder whole.
    save_checkpoint(folder, model, source, target)
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.json", "config.json", "model.safetensors",
                                                        "source_tokenizer.json", "target_tokenizer.json"]
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="corrupt: model.safetensors does not match its recorded SHA-256"):
        load_checkpoint(folder)
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        load_checkpoint(tmp_path / "nowhere")
    # A config that does not fit the weights: the error names the tensor and both shapes.
    other = save_checkpoint(tmp_path / "other", model, source, target)
    config = json.loads((other / "config.json").read_text())
    config["hidden_size"] = 48
    manifest = json.loads((other / "checkpoint.json").read_text())
    (other / "config.json").write_text(json.dumps(config))
    import hashlib

    manifest["files"]["config.json"] = hashlib.sha256((other / "config.json").read_bytes()).hexdigest()
    (other / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"tensor 'bridge.weight': expected shape \(48, 96\), found \(64, 128\)"):
        load_checkpoint(other)


def test_warmup_then_inverse_square_root_schedule():
    config = TrainingConfig(lr=1e-3, warmup_steps=100)
    assert config.learning_rate(1) == pytest.approx(1e-5)
    assert config.learning_rate(100) == pytest.approx(1e-3)
    assert config.learning_rate(400) == pytest.approx(5e-4)
    assert TrainingConfig(lr=2e-3).learning_rate(7) == 2e-3
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        TrainingConfig(label_smoothing=1.0)


def test_metrics_use_sacrebleu():
    refs = ["the cat sat on the mat today", "a dog barked at the moon loudly", "short one here ok", "x y z w v"]
    perfect = corpus_scores(refs, refs)
    assert perfect.bleu == pytest.approx(100.0) and perfect.chrf == pytest.approx(100.0)
    assert "13a" in perfect.signature
    worse = corpus_scores(["the cat sat on a hat", "a dog barked", "short one", "x"], refs)
    assert 0 < worse.bleu < 100
    rows = bleu_by_length(["one two", "one two three four five six seven eight nine ten eleven twelve"] * 2,
                          refs, refs)
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("1-10", 2), ("11-15", 2)]


def test_a_time_limit_stops_validates_the_part_epoch_and_records_on_epoch_metrics(phrases, tmp_path):
    train_pairs, valid, _, source, target = phrases
    seen = []

    def on_epoch(model):
        seen.append(model.training)
        return {"probe": len(seen)}

    config = TrainingConfig(epochs=5, batch_size=32, max_seconds=1e-6)  # passes after the first step
    result = train(_seq2seq(source, target), source, target, train_pairs, valid, config, tmp_path, progress=False,
                   log=lambda _: None, on_epoch=on_epoch)
    assert (result.stopped, result.steps, result.epochs_done) == ("time-limit", 1, 1)
    (record,) = result.history["epochs"]
    assert record["probe"] == 1 and seen == [False]  # called once, in eval mode
    assert 0 < record["train_seconds"] <= record["seconds"]
    assert (tmp_path / "best").is_dir() and (tmp_path / "last").is_dir()
    # Enough time for every epoch: the limit never binds and on_epoch runs after each.
    seen.clear()
    result = train(_seq2seq(source, target), source, target, train_pairs[:64], valid,
                   TrainingConfig(epochs=2, batch_size=32, max_seconds=3600), tmp_path, overwrite=True,
                   progress=False, log=lambda _: None, on_epoch=on_epoch)
    assert (result.stopped, result.steps, result.epochs_done, len(seen)) == ("epochs", 4, 2, 2)
    with pytest.raises(ValueError, match="max_seconds must be a finite number > 0"):
        TrainingConfig(max_seconds=0)


def test_a_diverging_run_stops_with_an_error_instead_of_saving_nan_weights(phrases, tmp_path):
    from attnkit.training.loop import TrainingDiverged

    train_pairs, valid, _, source, target = phrases
    model = _seq2seq(source, target)
    with torch.no_grad():  # what a far too large learning rate ends in: an overflowed weight
        next(model.parameters())[4:, 0] = float("inf")
    with pytest.raises(TrainingDiverged, match="training diverged at step 1"):
        train(model, source, target, train_pairs, valid, TrainingConfig(epochs=1, batch_size=32, clip_norm=0),
              tmp_path, progress=False, log=lambda _: None)
    assert not (tmp_path / "last").exists()  # nothing with NaN weights was written


def test_checkpoints_with_the_older_norm_names_still_load(phrases, tmp_path):
    from safetensors.torch import load_file, save_file

    from attnkit.models import TransformerConfig, TransformerEncoderDecoder
    from attnkit.training.checkpoint import _sha256

    _, _, _, source, target = phrases
    config = TransformerConfig(source.vocab_size, target.vocab_size, d_model=16, num_heads=2, d_ff=24,
                               encoder_layers=1, decoder_layers=1)
    model = TransformerEncoderDecoder(config)
    folder = save_checkpoint(tmp_path / "ckpt", model, source, target)
    tensors = load_file(folder / "model.safetensors")
    old = {name.replace(".attn_norm.", ".attn_block.norm.").replace(".ff_norm.", ".ff_block.norm.")
           .replace(".self_norm.", ".self_block.norm.").replace(".cross_norm.", ".cross_block.norm."): t
           for name, t in tensors.items()}
    assert any(".self_block.norm." in name for name in old)
    save_file(old, folder / "model.safetensors")
    manifest = json.loads((folder / "checkpoint.json").read_text())
    manifest["files"]["model.safetensors"] = _sha256(folder / "model.safetensors")
    (folder / "checkpoint.json").write_text(json.dumps(manifest))
    loaded = load_checkpoint(folder).model
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["before-the-first-validation", "during-a-validation", "during-the-last-validation"])
def test_a_stop_at_any_phase_resumes_to_the_weights_of_an_uninterrupted_run(phrases, tmp_path, monkeypatch, phase,
                                                                            signal_name):
    """Ctrl-C or SIGTERM (a scheduler's time limit) before the first validation (the best loss still infinite,
    stored as null), during one, or during the last: a checkpoint, then --resume continues to the same weights
    as a run never stopped."""
    import os
    import signal

    from attnkit.training import loop

    train_pairs, valid, _, source, target = phrases
    train_pairs = train_pairs[:160]
    config = TrainingConfig(epochs=2, batch_size=32, lr=2e-3, warmup_steps=2, seed=3, patience=0)
    quiet = {"progress": False, "log": lambda _: None}
    whole = train(_seq2seq(source, target, dropout=0.2), source, target, train_pairs, valid, config, tmp_path / "whole",
                  **quiet)
    number = getattr(signal, signal_name)
    real_step, real_validate = loop._Trainer._step, loop._Trainer._validate
    validations = []

    def step(self, indices):
        if phase == "before-the-first-validation" and self.state.step == 2:
            os.kill(os.getpid(), number)
        return real_step(self, indices)

    def validate(self, *args, **kwargs):
        validations.append(1)
        if (phase == "during-a-validation" and len(validations) == 1) or (
                phase == "during-the-last-validation" and len(validations) == 2):
            os.kill(os.getpid(), number)
        return real_validate(self, *args, **kwargs)

    monkeypatch.setattr(loop._Trainer, "_step", step)
    monkeypatch.setattr(loop._Trainer, "_validate", validate)
    first = train(_seq2seq(source, target, dropout=0.2), source, target, train_pairs, valid, config,
                  tmp_path / "split", **quiet)
    monkeypatch.undo()
    if phase == "before-the-first-validation":
        assert first.stopped == "interrupted" and first.steps == 3 and not first.history["epochs"]
        saved = json.loads((tmp_path / "split" / "last" / "trainer.json").read_text())["progress"]
        assert saved["best_valid_loss"] is None  # JSON's "no validation yet"
    elif phase == "during-a-validation":
        assert first.stopped == "interrupted" and first.epochs_done == 1
    rest = train(_seq2seq(source, target, dropout=0.2), source, target, train_pairs, valid, config, tmp_path / "split",
                 resume=True, **quiet)
    assert rest.steps == whole.steps and rest.best_valid_loss == whole.best_valid_loss
    ours, theirs = load_checkpoint(tmp_path / "split" / "last").model, load_checkpoint(tmp_path / "whole" / "last").model
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(a, b), name
