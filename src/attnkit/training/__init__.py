"""Tools that drive models: the training loop, checkpoints, data parallelism, metrics."""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, load_trainer_state, save_checkpoint
from .loop import TrainingConfig, TrainingResult, train
from .losses import encode_pairs, evaluate_loss
from .metrics import bleu_by_length, corpus_scores
from .run import RunFolderError, check_run_folder

__all__ = [
    "TrainingConfig",
    "TrainingResult",
    "train",
    "encode_pairs",
    "evaluate_loss",
    "Checkpoint",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "load_trainer_state",
    "RunFolderError",
    "check_run_folder",
    "corpus_scores",
    "bleu_by_length",
]
