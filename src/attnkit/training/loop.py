"""The training loop for encoder-decoder models.

AdamW, gradient clipping, label smoothing, teacher forcing, length-bucketed batches, an optional
warm-up then inverse-square-root schedule (Vaswani et al. 2017, eq. 3), validation each epoch,
early stopping on validation loss, checkpoints that resume bit-identically, Ctrl-C that saves
before exiting, and data parallelism under torchrun.

Guided alignment (Garg et al. 2019; Chen et al. 2016): with ``alignment_weight`` > 0 and word
alignments of the training pairs (from eflomal or IBM Model 1), the loss adds, per target piece
with a link, the cross entropy between the attention that predicts it (one head of one decoder
layer for a Transformer; the one attention of an RNN model) and the uniform distribution over the
pieces of its linked source words.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .. import _signals
from .._files import write_json
from .._progress import progress_bar
from ..data.batching import BatchSampler, collate
from ..data.corpus import Pair
from ..data.tokenizer import Tokenizer
from ..errors import InputError
from .checkpoint import load_trainer_state, save_checkpoint
from .distributed import all_sum, is_main, world
from .guided import _guide_matrix, piece_guides
from .losses import cross_entropy_sum, encode_pairs, evaluate_loss, loss_sum
from .run import MARKER, prepare_run_folder, record_resume

__all__ = ["TrainingConfig", "TrainingResult", "training_record", "TrainerState", "TrainingDiverged", "train", "encode_pairs",
           "evaluate_loss", "RECIPES"]

logger = logging.getLogger(__name__)


class TrainingDiverged(InputError):
    """The loss or the gradient norm is not finite: weights would become NaN; training stops instead."""


RECIPES: dict[str, dict] = {
    # Vaswani et al. 2017, section 5.3: Adam with beta2 = 0.98, 4000 warm-up steps then lr ~ step^-0.5.
    "transformer": {"warmup_steps": 4000, "betas": (0.9, 0.98)},
}
"""Training defaults per model kind (``config.kind``) that differ from :class:`TrainingConfig`'s."""


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
    max_seconds: float | None = None  # stop after this much training wall clock (validation included, on_epoch not)
    checkpoint_every: int = 0  # also checkpoint every N steps (0: at the end of each epoch only)
    eval_batch_size: int = 128
    # Guided alignment: weight of the attention's cross entropy with the given alignments (0: off),
    # the Transformer decoder layer (None: the penultimate, as Garg et al. 2019) and head it trains.
    alignment_weight: float = 0.0
    alignment_layer: int | None = None
    alignment_head: int = 0

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
        if not (math.isfinite(self.alignment_weight) and self.alignment_weight >= 0):
            raise ValueError(f"TrainingConfig.alignment_weight must be a finite number >= 0, got {self.alignment_weight}")
        if self.alignment_head < 0:
            raise ValueError(f"TrainingConfig.alignment_head must be >= 0, got {self.alignment_head}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"TrainingConfig.max_steps must be >= 1 or None, got {self.max_steps}")
        if self.max_seconds is not None and not (math.isfinite(self.max_seconds) and self.max_seconds > 0):
            raise ValueError(f"TrainingConfig.max_seconds must be a finite number > 0 or None, got {self.max_seconds}")

    @classmethod
    def recipe(cls, kind: str, **changes) -> TrainingConfig:
        """The training defaults for a model kind (:data:`RECIPES`), with ``changes`` on top."""
        return cls(**{**RECIPES.get(kind, {}), **changes})

    def learning_rate(self, step: int) -> float:
        """Learning rate of optimiser step ``step`` (1-based)."""
        if self.warmup_steps == 0:
            return self.lr
        return self.lr * min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))


def training_record(config: TrainingConfig) -> dict:
    """``config`` as the run's marker records it (JSON: the betas a list)."""
    return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(config).items()}


@dataclass
class TrainingResult:
    folder: Path  # run folder: last/ (resumable), best/ (lowest validation loss), history.json
    steps: int
    epochs_done: int
    best_valid_loss: float
    stopped: str  # "epochs" | "early-stopping" | "max-steps" | "time-limit" | "interrupted"
    history: dict = field(default_factory=dict)
    new_steps: int = 0  # optimiser steps this call took (0: a resumed run already at its limits)


class _StopOnInterrupt:
    """The first Ctrl-C (SIGINT) or SIGTERM (a scheduler's time limit, ``timeout``, a closed terminal) asks
    the loop to checkpoint and stop at the next batch; a second one aborts."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        _signals.record(signum)  # (a command's exit status says which signal stopped it)
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)


def _where(state: TrainerState) -> str:
    """Where a run stands, in the same words wherever it is said: steps, epochs finished, batches into the next."""
    into = f", {state.batch} batches into epoch {state.epoch + 1}" if state.batch else ""
    return f"the run is at step {state.step}, {state.epoch} epoch{'' if state.epoch == 1 else 's'} finished{into}"


@dataclass
class TrainerState:
    """Where a run stands; saved in ``trainer.json`` (as "progress") so a resumed run continues exactly."""

    epoch: int = 0  # epochs finished
    batch: int = 0  # batches of the current epoch done
    step: int = 0  # optimiser steps done
    best_valid_loss: float = math.inf
    bad_epochs: int = 0  # epochs in a row without a better validation loss
    seconds: float = 0.0  # training wall clock so far (steps and validation; not on_epoch)
    stopped: str | None = None  # why the loop ended: "early-stopping", "max-steps", "time-limit", "interrupted"


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
    log: Callable[[str], None] | None = None,
    alignments: Sequence | None = None,
    on_epoch: Callable[[nn.Module], dict] | None = None,
) -> TrainingResult:
    """Train ``model`` and write checkpoints under ``folder`` (``last/``, ``best/``, ``history.json``).

    Under ``torchrun`` every rank calls this with the same arguments; each takes its share of every
    global batch, DistributedDataParallel averages the gradients, and rank 0 writes the files.
    With ``resume=True`` training continues from ``folder/last`` exactly where it stopped.

    ``folder`` must be new, empty or an attnkit run (see :mod:`attnkit.training.run`): an existing
    run needs ``resume`` or ``overwrite``; ``options`` (data and model choices, JSON-able) are
    recorded with the run and must be equal on resume. Epoch summaries go to ``log`` (default: this
    module's logger at INFO); ``progress`` shows a tqdm bar per epoch. ``alignments`` (one set of
    (source word, target word) links per training pair) feed guided alignment when
    ``config.alignment_weight`` > 0.

    ``on_epoch(model)``, if given, runs after each validation (on rank 0; the model in eval mode)
    and returns JSON-able metrics added to that epoch's record in the history (say BLEU, to plot
    quality against training time); its time is not training time. With
    ``config.max_seconds`` the run stops once the training wall clock (optimiser steps and
    validation) passes it, validating the part of the epoch it did (counted as an epoch).
    """
    folder = Path(folder)
    recorded = training_record(config)
    if is_main():
        prepare_run_folder(folder, resume=resume, overwrite=overwrite, options=options, training=recorded)
    trainer = _Trainer(model, source_tokenizer, target_tokenizer, train_pairs, valid_pairs, config, folder,
                       progress=progress, log=log or logger.info, alignments=alignments, on_epoch=on_epoch)
    if resume:
        trainer.restore()
        if is_main() and trainer.reached() is None:  # a change applies only where a step will run under it
            for change in record_resume(folder, recorded, trainer.state.step):
                trainer.log(f"resume: {change['option']} {change['was']!r} -> {change['now']!r} from step "
                            f"{trainer.state.step} on (recorded in {folder / MARKER})")
    else:
        torch.manual_seed(config.seed + 1)  # dropout stream; rank-independent so runs can be compared
    return trainer.run()


class _Trainer:
    """One run of :func:`train`: the epochs, validation and checkpoints around the optimiser steps."""

    def __init__(self, model, source_tokenizer, target_tokenizer, train_pairs, valid_pairs, config: TrainingConfig,
                 folder: Path, *, progress: bool, log: Callable[[str], None], alignments=None, on_epoch=None):
        from torch.nn.parallel import DistributedDataParallel

        self.model, self.config, self.folder, self.progress, self.log = model, config, folder, progress, log
        self.device = next(model.parameters()).device  # batches follow the model (model.to("cuda") trains there)
        self.tokenizers = (source_tokenizer, target_tokenizer)
        self.rank, self.world_size = world()
        self.main = is_main()
        self.on_epoch = on_epoch
        self._epoch_length = 0  # batches in the epoch running now
        self.guides = None
        if config.alignment_weight > 0:
            if alignments is None:
                raise ValueError("TrainingConfig.alignment_weight > 0 needs alignments of the training pairs")
            kept = [k for k, p in enumerate(train_pairs) if source_tokenizer.encode(p.source) and target_tokenizer.encode(p.target)]
            guides = piece_guides(train_pairs, alignments, source_tokenizer, target_tokenizer)
            self.guides = [guides[k] for k in kept]  # encode_pairs drops the same empty pairs
            self.weights_options = self._weights_options(model)
        elif alignments is not None:
            raise ValueError("alignments were given but TrainingConfig.alignment_weight is 0: set a weight > 0")
        self.train_data = encode_pairs(train_pairs, source_tokenizer, target_tokenizer)
        self.valid_data = encode_pairs(valid_pairs, source_tokenizer, target_tokenizer)
        if not self.train_data or not self.valid_data:
            raise ValueError(f"need training and validation pairs, got {len(self.train_data)} and {len(self.valid_data)}")
        self.sampler = BatchSampler([(len(s), len(t)) for s, t in self.train_data], config.batch_size, seed=config.seed)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.net = DistributedDataParallel(model) if self.world_size > 1 else model
        self.state = TrainerState()
        self.history: dict[str, list] = {"steps": [], "epochs": []}

    def _weights_options(self, model) -> dict:
        """Keyword arguments that make ``model`` return the attention guided alignment trains."""
        from ..models import Seq2Seq

        config = self.config
        if isinstance(model, Seq2Seq):
            if model.style == "none":
                raise ValueError("guided alignment needs attention; this model is the bottleneck (attention='none')")
            if config.alignment_layer is not None or config.alignment_head != 0:
                raise ValueError("an RNN model has one attention: leave alignment_layer None and alignment_head 0")
            return {}
        layers, heads = model.config.decoder_layers, model.config.num_heads
        layer = config.alignment_layer if config.alignment_layer is not None else (-2 if layers > 1 else -1)
        if not -layers <= layer < layers:
            raise ValueError(f"TrainingConfig.alignment_layer must be in [{-layers}, {layers}), got {layer}")
        if config.alignment_head >= heads:
            raise ValueError(f"TrainingConfig.alignment_head must be in [0, {heads}), got {config.alignment_head}")
        return {"need_weights": True, "weights_layer": layer, "weights_head": config.alignment_head}

    def restore(self) -> None:
        saved = load_trainer_state(self.folder / "last", self.model, self.optimizer)
        progress = dict(saved["progress"])
        if progress.get("best_valid_loss") is None:  # JSON keeps no infinity: null is "no validation yet"
            progress["best_valid_loss"] = math.inf
        self.state = TrainerState(**progress)
        self.history = saved["history"]
        self.log(f"resuming from {self.folder / 'last'}: {_where(self.state)}")

    def reached(self) -> str | None:
        """The limit a (resumed) run already meets before any step, or None: nothing is left to do."""
        config, state = self.config, self.state
        if config.max_steps is not None and state.step >= config.max_steps:
            return "max-steps"
        if state.epoch >= config.epochs:
            return "epochs"
        if config.max_seconds is not None and state.seconds >= config.max_seconds:
            return "time-limit"
        return None

    def run(self) -> TrainingResult:
        self.model.train()
        start = self.state.step
        done = self.reached()
        if done is not None:  # nothing to train: no step, no checkpoint rewritten
            s = self.state
            if self.main:
                self.log(f"nothing to train: {_where(s)}, which already meets its {done} limit")
            return TrainingResult(self.folder, s.step, s.epoch, s.best_valid_loss, done, self.history, new_steps=0)
        with _StopOnInterrupt() as interrupt:
            while self.state.epoch < self.config.epochs and self.state.stopped is None:
                started = time.perf_counter()
                self._run_epoch(interrupt)
                if self.state.stopped not in (None, "time-limit") or self.state.batch == 0:
                    break  # (time ran out before a step of this epoch: nothing new to validate)
                self._validate(started)
                self._checkpoint("last")
            if self.state.stopped == "max-steps" and self.state.batch:  # weights no validation has seen yet
                self._validate(started, whole_epoch=self.state.batch >= self._epoch_length)
            if self.state.stopped in ("interrupted", "max-steps"):
                self._checkpoint("last")
                if self.state.stopped == "interrupted" and self.main:
                    self.log(f"interrupted: checkpoint saved to {self.folder / 'last'}; continue with --resume")
        s = self.state
        return TrainingResult(self.folder, s.step, s.epoch, s.best_valid_loss, s.stopped or "epochs", self.history,
                              new_steps=s.step - start)

    def _run_epoch(self, interrupt: _StopOnInterrupt) -> None:
        """The optimiser steps of one epoch, from where the state says it stands; sets ``stopped``."""
        config, state = self.config, self.state
        epoch = state.epoch
        batches = self.sampler.epoch(epoch, rank=self.rank, world_size=self.world_size)
        self._epoch_length = len(batches)
        bar = None
        if self.progress and self.main:
            bar = progress_bar(total=len(batches), initial=state.batch, desc=f"epoch {epoch + 1}/{config.epochs}",
                               unit="batch", progress=True)
        clock = time.perf_counter() - state.seconds  # state.seconds = perf_counter() - clock
        for index in range(state.batch, len(batches)):
            if all_sum(float(interrupt.requested)) > 0:
                state.stopped = "interrupted"
                break
            if config.max_seconds is not None and all_sum(float(state.seconds >= config.max_seconds)) > 0:
                state.stopped = "time-limit"
                break
            loss, tokens, rate = self._step(batches[index])
            state.seconds = time.perf_counter() - clock
            state.batch, state.step = index + 1, state.step + 1
            self.history["steps"].append({"step": state.step, "epoch": epoch + 1, "loss": loss, "tokens": tokens,
                                          "tokens_per_s": rate})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
            if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                self._checkpoint("last")
            if config.max_steps is not None and state.step >= config.max_steps:
                state.stopped = "max-steps"
                break
        if bar is not None:
            bar.close()

    def _step(self, indices: Sequence[int]) -> tuple[float, int, float]:
        """One optimiser step on the batch of training pairs ``indices``; -> (mean translation loss
        per token over all ranks, tokens, tokens/s)."""
        config = self.config
        chunk = [self.train_data[i] for i in indices]
        batch = collate([s for s, _ in chunk], [t for _, t in chunk]).to(self.device)
        tick = time.perf_counter()
        global_tokens = all_sum(batch.target_tokens)
        step = self.state.step + 1
        for group in self.optimizer.param_groups:
            group["lr"] = config.learning_rate(step)
        if self.guides is None:
            summed = loss_sum(self.net, batch, config.label_smoothing)
            objective = summed
        else:
            output = self.net(batch.source, batch.source_lengths, batch.target_in, **self.weights_options)
            summed = cross_entropy_sum(output.logits, batch, config.label_smoothing)
            guide = _guide_matrix([self.guides[i] for i in indices], tuple(output.weights.shape)).to(self.device)
            alignment_sum = -(guide * output.weights.float().clamp_min(1e-9).log()).sum()
            objective = summed + config.alignment_weight * alignment_sum
        # Each rank's sum over the global token count; DDP's gradient mean then gives the gradient of
        # the global per-token mean.
        (objective * self.world_size / global_tokens).backward()
        loss = all_sum(float(summed.detach())) / global_tokens
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm if config.clip_norm > 0 else math.inf)
        if not (math.isfinite(loss) and math.isfinite(float(norm))):
            raise TrainingDiverged(
                f"training diverged at step {step}: loss {loss}, gradient norm {float(norm)}; this step was "
                "not applied and nothing was saved after the last checkpoint (lower the learning rate)")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, int(global_tokens), global_tokens / max(time.perf_counter() - tick, 1e-9)

    def _validate(self, started: float, whole_epoch: bool = True) -> None:
        """Validation loss at the end of an epoch: history, best/ checkpoint, early stopping. A run that
        stops at ``max_steps`` partway through an epoch is validated too (``whole_epoch=False``): its
        record says ``"partial": True``, its weights can become best/, and the epoch stays open (a
        resumed run finishes it and validates again), with no early-stopping count."""
        state, epoch = self.state, self.state.epoch
        tick = time.perf_counter()
        valid_loss = evaluate_loss(self.model, self.valid_data, self.config.eval_batch_size)
        state.seconds += time.perf_counter() - tick
        seconds = time.perf_counter() - started
        # From the step records, so an epoch resumed halfway still counts all its batches.
        steps = [s for s in self.history["steps"] if s["epoch"] == epoch + 1]
        train_loss = sum(s["loss"] * s["tokens"] for s in steps) / max(sum(s["tokens"] for s in steps), 1)
        record = {"epoch": epoch + 1, "step": state.step, "train_loss": train_loss, "valid_loss": valid_loss,
                  "seconds": seconds, "train_seconds": state.seconds, **({} if whole_epoch else {"partial": True})}
        if self.on_epoch is not None and self.main:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                record |= self.on_epoch(self.model)
            self.model.train(was_training)
        self.history["epochs"].append(record)
        improved = valid_loss < state.best_valid_loss - 1e-4
        if whole_epoch:
            state.epoch, state.batch = epoch + 1, 0
        if improved:
            state.best_valid_loss = valid_loss
            state.bad_epochs = 0 if whole_epoch else state.bad_epochs
            self._checkpoint("best")
        elif whole_epoch:
            state.bad_epochs += 1
        if self.main:
            self.log(f"epoch {epoch + 1}{'' if whole_epoch else f' (step {state.step}, partial)'}: train loss {train_loss:.3f}, valid loss {valid_loss:.3f} "
                     f"(ppl {math.exp(min(valid_loss, 50)):.1f}){' *' if improved else ''}, {seconds:.0f}s")
        if whole_epoch and self.config.patience and state.bad_epochs >= self.config.patience:
            state.stopped = "early-stopping"

    def _checkpoint(self, name: str) -> None:
        """``last`` (resumable: optimiser, RNG, progress, history) or ``best`` (the model only); rank 0 writes."""
        if not self.main:
            return
        resumable = name == "last"
        progress = {k: v for k, v in asdict(self.state).items() if k != "stopped"}
        trainer = {"progress": progress, "history": self.history, "training_config": asdict(self.config)}
        save_checkpoint(self.folder / name, self.model, *self.tokenizers, trainer=trainer if resumable else None,
                        optimizer=self.optimizer if resumable else None)
        if resumable:
            write_json(self.folder / "history.json", self.history)
