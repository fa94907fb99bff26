"""Run folders: what ``train`` may write into, and nothing the user had is lost.

A run folder is attnkit's only when it carries the marker file ``attnkit-run.json`` (written when a
run starts, with the data and model options of the run and its training options). ``train`` refuses a
non-empty folder without the marker, refuses an existing run unless told to resume it or to overwrite
it, and on resume refuses changed data or model options, naming them; a training option changed on
resume is applied and recorded in the marker's ``changes`` with the step it applies from.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .._files import read_json, write_json
from ..errors import InputError
from .checkpoint import recover_checkpoint

__all__ = ["MARKER", "RunFolderError", "check_run_folder", "prepare_run_folder", "record_resume", "recorded_training",
           "RUN_FILES"]

MARKER = "attnkit-run.json"
FORMAT = "attnkit-run"
RUN_FILES = ("last", "best", "history.json", MARKER)
"""What a run writes; --overwrite removes these (and stale temporaries) and nothing else."""


class RunFolderError(InputError):
    """A run folder that train must not write into, or options that do not fit the run."""


def _recorded(folder: Path) -> dict:
    data = read_json(folder / MARKER, "run marker")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("options"), dict):
        raise RunFolderError(f"{folder / MARKER} is not an attnkit run marker")
    return data["options"]


def check_run_folder(folder: str | os.PathLike, *, resume: bool, overwrite: bool, options: dict | None = None) -> None:
    """Raise :class:`RunFolderError` unless ``train`` may use ``folder`` as asked. Writes nothing."""
    folder = Path(folder)
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite contradict each other; choose one")
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"--out {folder} is a file, not a folder")
    if not folder.exists() or not any(folder.iterdir()):
        if resume:
            raise RunFolderError(f"--resume: {folder} holds no run to resume")
        return
    if not (folder / MARKER).is_file():
        raise RunFolderError(
            f"--out {folder} is not empty and is not an attnkit run (no {MARKER}); attnkit writes only into a new "
            "or empty folder or one of its own runs"
        )
    recorded = _recorded(folder)
    started = any((folder / name).exists() for name in ("last", "best", "history.json")) or bool(_stale(folder))
    if not started and not resume:  # a marker alone: a run that stopped before it wrote anything
        return
    if not resume and not overwrite:
        raise RunFolderError(f"--out {folder} already holds an attnkit run: continue it with --resume, or start "
                             "again with --overwrite (which deletes its checkpoints)")
    if overwrite:
        foreign = _foreign_files(folder)
        if foreign:
            raise RunFolderError(f"--overwrite would delete files attnkit did not write: {', '.join(foreign[:5])}; "
                                 "move them out of the run folder first")
    if resume and options is not None:
        changed = sorted(name for name in set(recorded) | set(options) if recorded.get(name) != options.get(name))
        if changed:
            details = ", ".join(f"{name} (run: {recorded.get(name)!r}, now: {options.get(name)!r})" for name in changed)
            raise RunFolderError(f"--resume: data or model options differ from the run's: {details}")


def _foreign_files(folder: Path) -> list[str]:
    """Files inside the run's checkpoint folders that their manifests do not list (a user's own)."""
    foreign = []
    for name in ("last", "best"):
        checkpoint = folder / name
        if not checkpoint.is_dir():
            continue
        try:
            listed = set(read_json(checkpoint / "checkpoint.json", "checkpoint manifest").get("files", {}))
        except (OSError, ValueError, AttributeError):
            listed = set()
        listed.add("checkpoint.json")
        foreign += [p.relative_to(folder).as_posix() for p in sorted(checkpoint.rglob("*"))
                    if p.is_file() and p.relative_to(checkpoint).as_posix() not in listed]
    return foreign


def _stale(folder: Path) -> list[Path]:
    return [p for name in ("last", "best") for pattern in (f".{name}.tmp-*", f".{name}.old-*")
            for p in folder.glob(pattern)]


def recorded_training(folder: str | os.PathLike) -> dict | None:
    """The training options the run in ``folder`` records (its :class:`TrainingConfig` as a dict), or None
    for a run that recorded none (made before runs recorded them)."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    data = read_json(marker, "run marker")
    training = data.get("training") if isinstance(data, dict) else None
    return training if isinstance(training, dict) else None


def record_resume(folder: str | os.PathLike, training: dict, step: int) -> list[dict]:
    """On resume at ``step``: the training options that differ from the run's are recorded in its marker
    (``changes``: the step, each option with its value before and now) and become the run's. Returns them."""
    marker = Path(folder) / MARKER
    data = read_json(marker, "run marker")
    before = data.get("training")
    changes = [] if not isinstance(before, dict) else [
        {"option": name, "was": before.get(name), "now": value} for name, value in training.items()
        if before.get(name) != value]
    if changes or not isinstance(before, dict):
        data["training"] = training
        if changes:
            data.setdefault("changes", []).append({"step": step, "changed": changes})
        write_json(marker, data)
    return changes


def prepare_run_folder(folder: str | os.PathLike, *, resume: bool, overwrite: bool, options: dict | None,
                       training: dict | None = None) -> None:
    """Check (see :func:`check_run_folder`), then make the folder ready: on resume, recover a
    checkpoint a crash left half-swapped; with overwrite, delete the old run's files only; write the
    marker; remove stale temporaries."""
    folder = Path(folder)
    check_run_folder(folder, resume=resume, overwrite=overwrite, options=options)
    folder.mkdir(parents=True, exist_ok=True)
    if resume:
        for name in ("last", "best"):
            recover_checkpoint(folder / name)
    if overwrite:
        for name in RUN_FILES:
            path = folder / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    for path in _stale(folder):
        shutil.rmtree(path, ignore_errors=True)
    if not resume:  # (re)written: a marker left by a run that stopped before writing anything is replaced
        marker = {"format": FORMAT, "version": 2, "options": options or {}}
        if training is not None:
            marker["training"] = training
        write_json(folder / MARKER, marker)
