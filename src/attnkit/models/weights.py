"""Model weights as safetensors: save, and load with a clear error for any mismatch.

Tied parameters (e.g. shared embeddings and output layer) are stored once, under the first name
``state_dict()`` gives them. Loading never unpickles: safetensors holds tensors and a JSON header.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from .._files import atomic_path, read_json
from ..errors import InputError
from .hf_config import UnsupportedConfigError

__all__ = ["unique_state_dict", "save_weights", "load_weights", "check_tensors", "current_name", "fused_experts",
           "read_checkpoint_folder", "untied_by_checkpoint", "LEGACY_NAMES", "read_safetensors", "mixtral_names",
           "load_placed", "load_native_folder"]


def unique_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``state_dict()`` without the second and later names of tied tensors: the same memory, the same
    shape and strides. Distinct parameters that are views into one buffer (cuDNN flattens an RNN's
    weights into one on CUDA) are kept, each under its own name."""
    seen: set[tuple[torch.device, int, torch.dtype, tuple[int, ...], tuple[int, ...]]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if key in seen and tensor.numel():
            continue
        seen.add(key)
        out[name] = tensor
    return out


def check_tensors(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], source: str) -> None:
    """Raise ``ValueError`` listing missing, unexpected and mis-shaped tensors (name, expected, found)."""
    problems = []
    for name in sorted(set(expected) - set(found)):
        problems.append(f"missing tensor {name!r} (expected shape {expected[name]})")
    for name in sorted(set(found) - set(expected)):
        problems.append(f"unexpected tensor {name!r} (shape {found[name]})")
    for name in sorted(set(expected) & set(found)):
        if tuple(expected[name]) != tuple(found[name]):
            problems.append(f"tensor {name!r}: expected shape {tuple(expected[name])}, found {tuple(found[name])}")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise InputError(f"{source} does not match the model:\n  " + "\n  ".join(shown))


def save_weights(model: nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    tensors = {name: t.detach().contiguous().cpu() for name, t in unique_state_dict(model).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


# Names of the norms before the blocks were written out (attnkit 0.1.0 checkpoints): old -> new.
LEGACY_NAMES = ((".attn_block.norm.", ".attn_norm."), (".ff_block.norm.", ".ff_norm."), (".mlp_block.norm.", ".mlp_norm."),
                (".self_block.norm.", ".self_norm."), (".cross_block.norm.", ".cross_norm."))


def current_name(name: str) -> str:
    """A tensor name as this version calls it (older checkpoints named the norms after their blocks)."""
    for old, new in LEGACY_NAMES:
        name = name.replace(old, new)
    return name


def read_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensors of a safetensors file; a missing file raises ``FileNotFoundError``, anything that
    is not safetensors (a pickle, garbage, a truncated file) ``ValueError``. Nothing is unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"weights file not found: {path}") from None
    except (SafetensorError, OSError) as error:
        raise InputError(f"{path}: not a readable safetensors file ({error})") from error


def load_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Load safetensors weights into ``model`` in place; any mismatch raises ``ValueError``."""
    tensors = {current_name(name): tensor for name, tensor in read_safetensors(path).items()}
    expected = {name: tuple(t.shape) for name, t in unique_state_dict(model).items()}
    check_tensors(expected, {name: tuple(t.shape) for name, t in tensors.items()}, str(path))
    state = model.state_dict()
    for name, tensor in tensors.items():  # copy_ would cast integers silently and NaN would decode garbage
        if state[name].is_floating_point() and not tensor.is_floating_point():
            raise InputError(f"{path}: {name} holds {tensor.dtype} values where the model has {state[name].dtype} "
                             "weights; not a trained checkpoint")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{path}: {name} holds NaN or infinite values; the checkpoint is broken (a diverged "
                             "or damaged run)")
    with torch.no_grad():
        state = model.state_dict()
        for name, tensor in tensors.items():
            state[name].copy_(tensor)


_MIXTRAL_EXPERTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def mixtral_names(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Mixtral's names of a mixture of experts, as MiniMax's and Kimi Linear's checkpoints keep them (and transformers
    writes them back on save), in transformers' runtime names: ``block_sparse_moe`` as ``mlp``, each expert's ``w1``,
    ``w3``, ``w2`` as its ``gate_proj``, ``up_proj``, ``down_proj`` (:func:`fused_experts` then stacks them)."""
    out = {}
    for name, tensor in tensors.items():
        parts = name.replace(".block_sparse_moe.", ".mlp.").split(".")
        if len(parts) >= 4 and parts[-4] == "experts" and parts[-3].isdigit() and parts[-2] in _MIXTRAL_EXPERTS:
            parts[-2] = _MIXTRAL_EXPERTS[parts[-2]]
        out[".".join(parts)] = tensor
    return out


def fused_experts(tensors: dict[str, Tensor], prefix_parts: int) -> dict[str, Tensor]:
    """Per-expert tensors of a hub checkpoint (``...mlp.experts.{e}.gate_proj.weight`` and its ``up_proj``,
    ``down_proj``) stacked into transformers' fused ``gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F); every
    other tensor as it is. ``prefix_parts``: the dot-separated parts before ``mlp`` (``model.layers.i``: 3;
    ``layers.i``: 2)."""
    per_expert: dict[str, dict[int, dict[str, Tensor]]] = {}
    out = {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        n = prefix_parts
        if len(parts) == n + 5 and parts[n:n + 2] == ["mlp", "experts"] and parts[n + 2].isdigit():
            per_expert.setdefault(".".join(parts[:n + 2]), {}).setdefault(int(parts[n + 2]), {})[parts[n + 3]] = tensor
        else:
            out[name] = tensor
    for prefix, experts in per_expert.items():
        order = sorted(experts)
        out[prefix + ".gate_up_proj"] = torch.stack([torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]])
                                                     for e in order])
        out[prefix + ".down_proj"] = torch.stack([experts[e]["down_proj"] for e in order])
    return out


def read_checkpoint_folder(folder: str | os.PathLike, *, num_layers: int | None = None) -> dict[str, Tensor]:
    """Every tensor of a transformers checkpoint folder, as transformers reads it: ``model.safetensors`` where it is
    there, else the shards ``model.safetensors.index.json`` names (each tensor from the shard its ``weight_map``
    gives; a shard it names that is missing, or a tensor not in its shard, is named). No other file is read: a
    stray ``model-backup.safetensors`` overrides nothing. Multi-token-prediction tensors, which transformers' models
    do not run, are left out: ``mtp.*`` (Qwen3-Next) and, given ``num_layers``, the layers past it
    (``model.layers.{num_layers}.*``: DeepSeek-V3's extra layer). Safetensors only: no code runs."""
    from pathlib import Path

    from .._files import read_json

    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        tensors = read_safetensors(single)
    elif index.is_file():
        listed = read_json(index, "safetensors index")
        weight_map = listed.get("weight_map") if isinstance(listed, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index}: no weight_map of tensor names to shard files")
        shards = sorted(set(weight_map.values()))
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shards named by model.safetensors.index.json are missing: {missing}")
        tensors = {}
        for shard in shards:
            held = read_safetensors(folder / shard)
            tensors.update({name: held[name] for name, file in weight_map.items() if file == shard and name in held})
        absent = sorted(name for name, shard in weight_map.items() if name not in tensors)
        if absent:
            raise InputError(f"{folder}: tensors model.safetensors.index.json places in shards that lack them: "
                             f"{_listed(absent)}")
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors (or model.safetensors.index.json and its shards)")
    return {name: tensor for name, tensor in tensors.items() if not _multi_token_prediction(name, num_layers)}


def _multi_token_prediction(name: str, num_layers: int | None) -> bool:
    if name.startswith("mtp."):
        return True
    parts = name.split(".")
    return (num_layers is not None and len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit()
            and int(parts[2]) >= num_layers)


def untied_by_checkpoint(config, tensors: dict[str, Tensor], embedding: str, head: str = "lm_head.weight"):
    """``config``, or a copy with ``tie_embeddings=False`` where it says the output projection is the embedding but
    the checkpoint holds its own ``head`` that differs from ``embedding``: transformers then uses the checkpoint's
    head (and warns), and so does attnkit, with a UserWarning naming the config key to fix."""
    import dataclasses
    import warnings

    if not getattr(config, "tie_embeddings", False) or head not in tensors or embedding not in tensors:
        return config
    if tensors[head].shape == tensors[embedding].shape and torch.equal(tensors[head], tensors[embedding]):
        return config
    warnings.warn(f"the config says tie_word_embeddings=true, but the checkpoint holds its own {head} that differs "
                  f"from {embedding}: it is used (untied), as transformers does. Set tie_word_embeddings to false in "
                  "config.json to say so", UserWarning, stacklevel=3)
    return dataclasses.replace(config, tie_embeddings=False)


def _listed(names: Sequence[str]) -> str:
    return f"{names[:5]}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def load_placed(model: nn.Module, state: dict[str, Tensor], *, source: object, unplaced: Sequence[str] = (),
                tied: bool = False, derived: tuple[str, ...] = ()) -> None:
    """Load a checkpoint's tensors, already under ``model``'s names, into ``model``: every tensor must find its place
    (``unplaced``: those the caller's name mapping had none for) and every parameter a tensor, or an
    :class:`~attnkit.errors.InputError` names both (``source``: the folder). ``tied``: the output projection is the
    embedding (a checkpoint's ``lm_head.weight`` is dropped); ``derived``: buffers computed from the config (their
    last name part), taken from the checkpoint where it has them and the model's own otherwise."""
    if tied:
        state = {name: tensor for name, tensor in state.items() if name != "lm_head.weight"}
    own = model.state_dict()
    expected = {name for name in own if not (tied and name == "lm_head.weight")}
    unknown = sorted([*unplaced, *(set(state) - expected)])
    missing = sorted(name for name in expected - set(state) if name.rsplit(".", 1)[-1] not in derived)
    if unknown or missing:
        raise InputError(f"{source}: tensors {type(model).__name__} has no place for: {_listed(unknown) if unknown else 'none'}"
                         f"; parameters the checkpoint lacks: {_listed(missing) if missing else 'none'}")
    wrong = [f"{name} {tuple(state[name].shape)} (config.json makes {tuple(own[name].shape)})" for name in sorted(state)
             if name in own and state[name].shape != own[name].shape]
    if wrong:  # (torch's own message is many lines, and names no config key)
        raise InputError(f"{source}: tensors whose shapes config.json's sizes do not give: {_listed(wrong)}")
    state = state | {name: own[name] for name in expected - set(state)}  # the derived buffers it does not carry
    model.load_state_dict(state, strict=not tied)


ConfigT = TypeVar("ConfigT")


def config_from_folder(folder: str | os.PathLike, config_from_hf: Callable[..., ConfigT], **options) -> ConfigT:
    """``config_from_hf`` of a checkpoint folder's ``config.json``; a key it refuses is named with the file
    (``.../config.json: mamba2 config: num_heads must be an integer >= 1, got '6'``)."""
    path = Path(folder) / "config.json"
    hf = read_json(path, "Hugging Face config")
    try:
        return config_from_hf(hf, **options)
    except UnsupportedConfigError as error:
        raise UnsupportedConfigError(f"{path}: {error}") from None


ModelT = TypeVar("ModelT", bound=nn.Module)


def load_native_folder(folder: str | os.PathLike, *, config_from_hf: Callable[[dict], ConfigT],
                       build: Callable[[ConfigT], ModelT], embedding: Sequence[str],
                       state: Callable[[dict[str, Tensor], ConfigT], dict[str, Tensor]],
                       dtype: torch.dtype | None = None) -> ModelT:
    """One of attnkit's native models from a transformers checkpoint folder, in eval mode, as every family's
    ``load_checkpoint_folder`` makes it: the config read (``config_from_hf``: every key read, harmless or refused by
    name), the tensors read (:func:`read_checkpoint_folder`), a tied head untied where the checkpoint holds its own
    (:func:`untied_by_checkpoint`; ``embedding``: the embedding's checkpoint names, the first present used), the model
    built (``build(config)``), the tensors under its names (``state(tensors, config)``) placed
    (:func:`load_placed`: every tensor a place, every parameter a tensor), then cast to ``dtype``. Never runs code."""
    folder = Path(folder)
    config = config_from_folder(folder, config_from_hf)
    tensors = read_checkpoint_folder(folder)
    config = untied_by_checkpoint(config, tensors, next((n for n in embedding if n in tensors), embedding[0]))
    model = build(config)
    load_placed(model, state(tensors, config), source=folder, tied=config.tie_embeddings)
    model = model if dtype is None else model.to(dtype)
    return model.eval()
