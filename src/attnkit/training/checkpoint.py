"""Checkpoints: one folder of safetensors + JSON + tokenisers, replaced atomically.

    <folder>/
      checkpoint.json          format, version, SHA-256 of every other file (written last)
      config.json              the model config (kind + fields)
      model.safetensors        weights
      source_tokenizer.json    tokenisers, as the ``tokenizers`` package writes them
      target_tokenizer.json
      trainer.json             training progress, hyper-parameters, history  (training checkpoints)
      trainer.safetensors      optimiser moments and the RNG state           (training checkpoints)

The folder is written under a temporary name and swapped in with renames, so a crash or Ctrl-C
leaves either the old checkpoint or the new one, never a mixture. Loading checks the hashes: a
truncated or edited file gets a clear error. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .._files import read_json, write_json
from ..data.tokenizer import Tokenizer
from ..errors import InputError
from ..models import build_model
from ..models.config import config_from_dict, config_to_dict
from ..models.weights import check_tensors, current_name, load_weights, read_safetensors, save_weights

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "load_trainer_state", "CheckpointError",
           "recover_checkpoint"]

FORMAT = "attnkit-checkpoint"
VERSION = 1


class CheckpointError(InputError):
    """A checkpoint folder is missing, incomplete, corrupt, or does not fit the model."""


@dataclass
class Checkpoint:
    model: nn.Module
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer
    folder: Path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """Split an optimiser state dict into tensors (for safetensors) and JSON-able rest."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _cuda_rng_states(model: nn.Module) -> dict[str, Tensor]:
    """The state of the CUDA generator of the model's device (dropout on the GPU draws from it);
    {} for a model on the CPU."""
    device = next(model.parameters()).device
    return {"rng.cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}


def _restore_cuda_rng(tensors: dict[str, Tensor], model: nn.Module) -> None:
    """Put the saved CUDA generator state back on the model's device, so that a run resumed on the
    GPU draws the same dropout masks as one that never stopped. A GPU run resumed on the CPU needs
    none (the CPU generator drives dropout there); a CPU run resumed on a GPU has none to restore,
    so its dropout draws differ from here on (the weights and optimiser are still exact)."""
    device = next(model.parameters()).device
    if device.type == "cuda" and "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng.cuda"], device)


def save_checkpoint(
    folder: str | os.PathLike,
    model: nn.Module,
    source_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    *,
    trainer: dict | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write a checkpoint folder atomically; ``trainer`` (JSON-able) and ``optimizer`` make it resumable."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(folder)  # a previous crash's half-swap is finished before a new save starts
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_json(tmp / "config.json", config_to_dict(model.config))
        save_weights(model, tmp / "model.safetensors")
        source_tokenizer.save(tmp / "source_tokenizer.json")
        target_tokenizer.save(tmp / "target_tokenizer.json")
        if trainer is not None:
            from safetensors.torch import save_file

            tensors = {"rng.torch": torch.get_rng_state()} | _cuda_rng_states(model)
            extra: dict = {}
            if optimizer is not None:
                optimizer_tensors, extra = _optimizer_tensors(optimizer)
                tensors |= optimizer_tensors
            save_file(tensors, str(tmp / "trainer.safetensors"))
            write_json(tmp / "trainer.json", {**trainer, "optimizer": extra})
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        write_json(tmp / "checkpoint.json", {"format": FORMAT, "version": VERSION, "files": files})
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _complete(folder: Path) -> bool:
    try:
        _verified(folder)
    except (CheckpointError, OSError):
        return False
    return True


def recover_checkpoint(folder: str | os.PathLike) -> bool:
    """Finish or undo a swap that a crash interrupted; remove stale temporaries. Returns whether a
    checkpoint folder is in place afterwards (verified against its manifest only when a crash left
    something behind; loading verifies it in any case).

    A save writes ``.<name>.tmp-<pid>`` completely (manifest last), renames ``<name>`` to
    ``.<name>.old-<pid>``, renames the temporary to ``<name>``, then deletes the old one. Killed
    after the first rename, the newest complete temporary (or else the old checkpoint) is renamed
    into place; leftovers of any step are deleted once ``<name>`` is complete.
    """
    folder = Path(folder)
    newest_first = lambda paths: sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)  # noqa: E731
    temporaries = newest_first(folder.parent.glob(f".{folder.name}.tmp-*"))
    olds = newest_first(folder.parent.glob(f".{folder.name}.old-*"))
    if not temporaries and not olds:  # nothing was interrupted: no need to hash the checkpoint here
        return folder.is_dir()
    if not folder.exists():
        candidate = next((p for p in [*temporaries, *olds] if _complete(p)), None)
        if candidate is not None:
            os.replace(candidate, folder)
    if not _complete(folder):
        return False
    for path in [*temporaries, *olds]:
        shutil.rmtree(path, ignore_errors=True)  # the one moved into place is gone from its old name
    return True


def _verified(folder: Path) -> dict:
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {folder}")
    manifest_path = folder / "checkpoint.json"
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder} is not an attnkit checkpoint (no checkpoint.json)")
    try:
        manifest = read_json(manifest_path)
    except ValueError as error:
        raise CheckpointError(f"{manifest_path} is corrupt ({error})") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{manifest_path}: not a checkpoint manifest (a JSON object with a 'files' object)")
    missing = {"config.json", "model.safetensors"} - set(manifest["files"])
    if missing:  # an empty or partial list would turn the hash checks off
        raise CheckpointError(f"{manifest_path}: the manifest does not list {sorted(missing)}")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{manifest_path}: expected format {FORMAT!r} version {VERSION}, "
            f"got {manifest.get('format')!r} version {manifest.get('version')!r}"
        )
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is incomplete: {name} is missing")
        if _sha256(path) != digest:
            raise CheckpointError(f"checkpoint {folder} is corrupt: {name} does not match its recorded SHA-256")
    return manifest


def load_checkpoint(folder: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model from ``config.json`` and load weights and tokenisers. A swap that a crash
    interrupted is completed first (:func:`recover_checkpoint`)."""
    folder = Path(folder)
    recover_checkpoint(folder)
    _verified(folder)
    try:
        config = config_from_dict(read_json(folder / "config.json"))
        _check_shapes_before_building(config, folder / "model.safetensors")
        model = build_model(config)
        load_weights(model, folder / "model.safetensors")
        source = Tokenizer.load(folder / "source_tokenizer.json")
        target = Tokenizer.load(folder / "target_tokenizer.json")
    except ValueError as error:
        raise CheckpointError(f"cannot load checkpoint {folder}: {error}") from error
    for side, tokenizer, size in (("source", source, config.source_vocab), ("target", target, config.target_vocab)):
        if tokenizer.vocab_size != size:
            raise CheckpointError(
                f"checkpoint {folder}: {side} tokenizer has {tokenizer.vocab_size} entries, config says {size}"
            )
    return Checkpoint(model.to(map_location), source, target, folder)


def _check_shapes_before_building(config, weights: Path) -> None:
    """Compare the config's tensor shapes (a model on the meta device: no memory) with the weights
    file's header, so that a config with absurd sizes is refused before anything is allocated.
    (Tied tensors cannot be told apart on the meta device, so names missing from the file are left
    to :func:`load_weights`; the sizes must still agree.)"""
    from safetensors import SafetensorError, safe_open

    try:
        with torch.device("meta"):
            model = build_model(config)
    except RuntimeError as error:  # sizes whose storage cannot even be described
        raise ValueError(f"the config describes tensors too large to exist ({error})") from None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as f:
            found = {current_name(name): tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as error:
        raise InputError(f"{weights}: not a readable safetensors file ({error})") from error
    check_tensors({name: shape for name, shape in expected.items() if name in found}, found, str(weights))
    described = sum(p.numel() for p in model.parameters())
    stored = sum(math.prod(shape) for shape in found.values())
    if described > 2 * stored + 1_000_000:
        raise InputError(f"{weights}: the config describes {described:,} parameters, the file holds {stored:,}")


def load_trainer_state(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Restore the weights, the optimiser and the RNG from a training checkpoint; return trainer.json."""
    folder = Path(folder)
    manifest = _verified(folder)
    if "trainer.json" not in manifest["files"]:
        raise CheckpointError(f"{folder} holds a model only (no trainer state); it cannot be resumed")
    try:
        load_weights(model, folder / "model.safetensors")
    except ValueError as error:
        raise CheckpointError(f"cannot resume from {folder}: {error}") from error
    trainer = read_json(folder / "trainer.json")
    try:
        tensors = read_safetensors(folder / "trainer.safetensors")
    except ValueError as error:  # a pickle or garbage: never unpickled, a clear refusal
        raise CheckpointError(str(error)) from error
    if optimizer is not None:
        extra = trainer["optimizer"]
        state: dict[int, dict] = {}
        for name, tensor in tensors.items():
            if name.startswith("optimizer."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = tensor
        for name, value in extra.get("scalars", {}).items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = value
        try:
            optimizer.load_state_dict({"state": state, "param_groups": extra["param_groups"]})
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"{folder}: optimiser state does not fit the model ({error})") from error
    torch.set_rng_state(tensors["rng.torch"])
    _restore_cuda_rng(tensors, model)
    return trainer
