"""The training loop for encoder-decoder models.

AdamW, gradient clipping, label smoothing, teacher forcing, length-bucketed batches, an optional
warm-up then inverse-square-root schedule (Vaswani et al. 2017, eq. 3), validation each epoch,
early stopping on validation loss, checkpoints that resume bit-identically, Ctrl-C that saves
before exiting, and data parallelism under torchrun.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .._files import write_json
from ..data.batching import BatchSampler, collate
from ..data.corpus import Pair
from ..data.tokenizer import PAD, Tokenizer
from .checkpoint import load_trainer_state, save_checkpoint
from .run import prepare_run_folder
from .distributed import all_sum, is_main, world

__all__ = ["TrainingConfig", "TrainingResult", "TrainingDiverged", "train", "encode_pairs", "evaluate_loss"]


class TrainingDiverged(ValueError):
    """The loss or the gradient norm is not finite: weights would become NaN; training stops instead."""


@dataclass(frozen=True)
class TrainingConfig:
    epochs: int = 10
    batch_size: int = 64  # sentences per global batch (split across ranks)
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    clip_norm: float = 1.0  # max global gradient norm; 0 disables clipping
    label_smoothing: float = 0.1
    warmup_steps: int = 0  # > 0: linear warm-up to lr, then decay as sqrt(warmup / step)
    patience: int = 3  # stop after this many epochs without a better validation loss
    seed: int = 0
    max_steps: int | None = None  # stop (and checkpoint) after this many optimiser steps in all
    checkpoint_every: int = 0  # also checkpoint every N steps (0: at the end of each epoch only)
    eval_batch_size: int = 128

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"TrainingConfig.lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm >= 0):
            raise ValueError(f"TrainingConfig.clip_norm must be a finite number >= 0 (0 disables), got {self.clip_norm}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"TrainingConfig.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"TrainingConfig.betas must be in [0, 1), got {self.betas}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"TrainingConfig.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("warmup_steps", "patience", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainingConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"TrainingConfig.max_steps must be >= 1 or None, got {self.max_steps}")

    def learning_rate(self, step: int) -> float:
        """Learning rate of optimiser step ``step`` (1-based)."""
        if self.warmup_steps == 0:
            return self.lr
        return self.lr * min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))


@dataclass
class TrainingResult:
    folder: Path  # run folder: last/ (resumable), best/ (lowest validation loss), history.json
    steps: int
    epochs_done: int
    best_valid_loss: float
    stopped: str  # "epochs" | "early-stopping" | "max-steps" | "interrupted"
    history: dict = field(default_factory=dict)


def encode_pairs(pairs: Sequence[Pair], source: Tokenizer, target: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """Token ids of each pair (no specials); pairs with an empty side are dropped."""
    sources = source.encode_batch([p.source for p in pairs])
    targets = target.encode_batch([p.target for p in pairs])
    return [(s, t) for s, t in zip(sources, targets) if s and t]


def _loss_sum(model: nn.Module, batch, label_smoothing: float) -> torch.Tensor:
    logits = model(batch.source, batch.source_lengths, batch.target_in).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.target_out.flatten(), ignore_index=PAD,
                           label_smoothing=label_smoothing, reduction="sum")


@torch.no_grad()
def evaluate_loss(model: nn.Module, data: Sequence[tuple[list[int], list[int]]], batch_size: int = 128) -> float:
    """Mean per-token cross entropy (nats, no smoothing) of ``data`` under teacher forcing."""
    was_training = model.training
    model.eval()
    total = tokens = 0.0
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    for start in range(0, len(order), batch_size):
        chunk = [data[i] for i in order[start : start + batch_size]]
        batch = collate([s for s, _ in chunk], [t for _, t in chunk])
        total += float(_loss_sum(model, batch, 0.0))
        tokens += batch.target_tokens
    model.train(was_training)
    return total / max(tokens, 1)


class _StopOnInterrupt:
    """First Ctrl-C asks the loop to checkpoint and stop at the next batch; a second one aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def train(
    model: nn.Module,
    source_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    train_pairs: Sequence[Pair],
    valid_pairs: Sequence[Pair],
    config: TrainingConfig,
    folder: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    options: dict | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TrainingResult:
    """Train ``model`` and write checkpoints under ``folder`` (``last/``, ``best/``, ``history.json``).

    Under ``torchrun`` every rank calls this with the same arguments; each takes its share of every
    global batch, DistributedDataParallel averages the gradients, and rank 0 writes the files.
    With ``resume=True`` training continues from ``folder/last`` exactly where it stopped.

    ``folder`` must be new, empty or an attnkit run (see :mod:`attnkit.training.run`): an existing
    run needs ``resume`` or ``overwrite``; ``options`` (data and model choices, JSON-able) are
    recorded with the run and must be equal on resume.
    """
    from torch.nn.parallel import DistributedDataParallel

    folder = Path(folder)
    if is_main():
        prepare_run_folder(folder, resume=resume, overwrite=overwrite, options=options)
    rank, world_size = world()
    train_data = encode_pairs(train_pairs, source_tokenizer, target_tokenizer)
    valid_data = encode_pairs(valid_pairs, source_tokenizer, target_tokenizer)
    if not train_data or not valid_data:
        raise ValueError(f"need training and validation pairs, got {len(train_data)} and {len(valid_data)}")
    sampler = BatchSampler([(len(s), len(t)) for s, t in train_data], config.batch_size, seed=config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                  weight_decay=config.weight_decay)
    progress_state = {"epoch": 0, "batch": 0, "step": 0, "best_valid_loss": math.inf, "bad_epochs": 0}
    history: dict[str, list] = {"steps": [], "epochs": []}
    if resume:
        trainer = load_trainer_state(folder / "last", model, optimizer)
        progress_state = trainer["progress"]
        history = trainer["history"]
        log(f"resuming from {folder / 'last'} at epoch {progress_state['epoch'] + 1}, step {progress_state['step']}")
    else:
        torch.manual_seed(config.seed + 1)  # dropout stream; rank-independent so runs can be compared
    net = DistributedDataParallel(model) if world_size > 1 else model
    main = is_main()

    def checkpoint(name: str = "last", with_trainer: bool = True) -> None:
        if not main:
            return
        trainer = {"progress": progress_state, "history": history, "training_config": asdict(config)}
        save_checkpoint(folder / name, model, source_tokenizer, target_tokenizer,
                        trainer=trainer if with_trainer else None, optimizer=optimizer if with_trainer else None)
        if with_trainer:
            write_json(folder / "history.json", history)

    stopped = "epochs"
    model.train()
    with _StopOnInterrupt() as interrupt:
        while progress_state["epoch"] < config.epochs and stopped == "epochs":
            epoch = progress_state["epoch"]
            batches = sampler.epoch(epoch, rank=rank, world_size=world_size)
            bar = None
            if progress and main:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(batches), initial=progress_state["batch"], desc=f"epoch {epoch + 1}/{config.epochs}",
                           unit="batch", leave=False, dynamic_ncols=True)
            started = time.perf_counter()
            for index in range(progress_state["batch"], len(batches)):
                if all_sum(float(interrupt.requested)) > 0:
                    stopped = "interrupted"
                    break
                chunk = [train_data[i] for i in batches[index]]
                batch = collate([s for s, _ in chunk], [t for _, t in chunk])
                tick = time.perf_counter()
                global_tokens = all_sum(batch.target_tokens)
                step = progress_state["step"] + 1
                for group in optimizer.param_groups:
                    group["lr"] = config.learning_rate(step)
                loss_sum = _loss_sum(net, batch, config.label_smoothing)
                # Each rank's sum over the global token count; DDP's gradient mean then gives the
                # gradient of the global per-token mean.
                (loss_sum * world_size / global_tokens).backward()
                loss = all_sum(float(loss_sum.detach())) / global_tokens
                norm = nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm if config.clip_norm > 0 else math.inf)
                if not (math.isfinite(loss) and math.isfinite(float(norm))):
                    raise TrainingDiverged(
                        f"training diverged at step {step}: loss {loss}, gradient norm {float(norm)}; this step was "
                        "not applied and nothing was saved after the last checkpoint (lower the learning rate)")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                progress_state.update(batch=index + 1, step=step)
                rate = global_tokens / max(time.perf_counter() - tick, 1e-9)
                history["steps"].append({"step": step, "epoch": epoch + 1, "loss": loss, "tokens": global_tokens,
                                         "tokens_per_s": rate})
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
                if config.checkpoint_every and step % config.checkpoint_every == 0:
                    checkpoint()
                if config.max_steps is not None and step >= config.max_steps:
                    stopped = "max-steps"
                    break
            if bar is not None:
                bar.close()
            if stopped != "epochs":
                break
            valid_loss = evaluate_loss(model, valid_data, config.eval_batch_size)
            seconds = time.perf_counter() - started
            # From the step records, so an epoch resumed halfway still counts all its batches.
            steps = [s for s in history["steps"] if s["epoch"] == epoch + 1]
            train_loss = sum(s["loss"] * s["tokens"] for s in steps) / max(sum(s["tokens"] for s in steps), 1)
            history["epochs"].append({"epoch": epoch + 1, "step": progress_state["step"], "train_loss": train_loss,
                                      "valid_loss": valid_loss, "seconds": seconds})
            improved = valid_loss < progress_state["best_valid_loss"] - 1e-4
            progress_state.update(epoch=epoch + 1, batch=0)
            if improved:
                progress_state.update(best_valid_loss=valid_loss, bad_epochs=0)
                checkpoint("best", with_trainer=False)
            else:
                progress_state["bad_epochs"] += 1
            if main:
                log(f"epoch {epoch + 1}: train loss {train_loss:.3f}, valid loss "
                    f"{valid_loss:.3f} (ppl {math.exp(min(valid_loss, 50)):.1f}){' *' if improved else ''}, {seconds:.0f}s")
            if config.patience and progress_state["bad_epochs"] >= config.patience:
                stopped = "early-stopping"
            checkpoint()
        if stopped in ("interrupted", "max-steps"):
            checkpoint()
            if stopped == "interrupted" and main:
                log(f"interrupted: checkpoint saved to {folder / 'last'}; continue with --resume")
    return TrainingResult(folder, progress_state["step"], progress_state["epoch"], progress_state["best_valid_loss"],
                          stopped, history)
