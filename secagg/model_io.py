"""The trained model as a run's output: saved beside ``result.json``, loaded back ready for
``model(x)``.

A run folder holds two files for the model:

* ``model.pt`` -- ``torch.save`` of plain state dicts: ``{"global": state_dict | None,
  "clients": {"<id>": state_dict}}`` (the clients' entries only for a personalized
  algorithm, whose clients each keep their own model);
* ``model.json`` -- how to rebuild the modules the state dicts fill: a *recipe*
  ``{"factory": "module:function", "kwargs": {...}}`` whose call returns an ``nn.Module``
  with exactly those parameters and buffers, plus what the model is (``kind``: ``"global"``
  or ``"personalized"``, the algorithm, the accuracy the run measured and on what).

An algorithm offers its model through ``export_model(clients)`` (see
:class:`algorithms.base.Algorithm`), returning a :class:`TrainedModel`; one that has no
PyTorch model (a Gaussian mixture) returns None and the run saves no model.

:func:`load_model` imports the factory the recipe names and reads the state dicts with
``torch.load(weights_only=True)``: the weights cannot run code, the factory can, so load
only run folders you trust (as with any Python module).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from secagg.errors import ConfigurationError

__all__ = ["MODEL_FILE", "MODEL_INFO", "PersonalizedModels", "TrainedModel", "build_from_recipe",
           "load_model", "save_model"]

#: File names inside a run folder.
MODEL_FILE, MODEL_INFO = "model.pt", "model.json"
#: Version of the model.json layout.
FORMAT = 1


def _nn() -> Any:
    import torch

    return torch.nn


class PersonalizedModels(_nn().Module):  # type: ignore[misc]
    """Each client's own model (a personalized algorithm): ``models[client_id](x)``.

    Calling it without a client is refused: there is no one model that the run's accuracy
    (the mean of the clients' local test accuracies) describes.
    """

    def __init__(self, clients: Mapping[int, Any]) -> None:
        super().__init__()
        self.clients = _nn().ModuleDict({str(k): m for k, m in sorted(clients.items())})

    def __getitem__(self, client: int) -> Any:
        key = str(int(client))
        if key not in self.clients:
            raise KeyError(f"no model for client {client}; clients: 0..{len(self.clients) - 1}")
        return self.clients[key]

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[int]:  # type: ignore[override]
        return (int(k) for k in self.clients)

    def forward(self, x: Any) -> Any:
        """Refused: pick a client first (``models[client_id](x)``)."""
        raise TypeError("a personalized model has one model per client: call "
                        "models[client_id](x), or load_model(run_dir, client=ID)")


@dataclass
class TrainedModel:
    """What an algorithm hands the run at its end: the global model and/or each client's.

    Attributes:
        recipe: ``{"factory": "module:function", "kwargs": {...}}`` (JSON-able) whose call
            returns an untrained module of the same structure as ``model`` (and as every
            client's model).
        model: the global model, or None (a personalized algorithm without one).
        clients: client id -> that client's model (personalized algorithms).
    """

    recipe: dict[str, Any]
    model: Any | None = None
    clients: dict[int, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``"personalized"`` when clients keep their own models, else ``"global"``."""
        return "personalized" if self.clients else "global"

    def module(self) -> Any:
        """What ``Result.model`` gives: the global model, or the clients' models."""
        return PersonalizedModels(self.clients) if self.clients else self.model


def build_from_recipe(recipe: Mapping[str, Any]) -> Any:
    """Call the recipe's factory with its kwargs (an untrained module)."""
    target = recipe.get("factory")
    if not isinstance(target, str) or ":" not in target:
        raise ConfigurationError(f"model recipe needs factory 'module:function', got {target!r}")
    mod, _, attr = target.partition(":")
    try:
        fn: Any = importlib.import_module(mod)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import the model factory {target!r}: {exc}") from None
    kwargs = dict(recipe.get("kwargs") or {})
    if "input_shape" in kwargs and isinstance(kwargs["input_shape"], list):
        kwargs["input_shape"] = tuple(kwargs["input_shape"])
    return fn(**kwargs)


def save_model(trained: TrainedModel, out_dir: str | Path,
               info: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write ``model.pt`` and ``model.json`` into ``out_dir``; ``info`` joins the JSON
    (e.g. the algorithm and the accuracy the run measured)."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {
        "global": None if trained.model is None else trained.model.state_dict(),
        "clients": {str(k): m.state_dict() for k, m in sorted(trained.clients.items())},
    }
    paths = {"model": out / MODEL_FILE, "model_info": out / MODEL_INFO}
    torch.save(state, paths["model"])
    meta = {"format": FORMAT, "kind": trained.kind, "recipe": trained.recipe,
            "has_global": trained.model is not None, "clients": len(trained.clients),
            **dict(info or {})}
    paths["model_info"].write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return paths


def read_model_info(run_dir: str | Path) -> dict[str, Any]:
    """The run folder's ``model.json`` (refused, with the reason, when there is none)."""
    path = Path(run_dir) / MODEL_INFO
    if not path.exists():
        raise ConfigurationError(
            f"{run_dir} holds no saved model ({MODEL_INFO} missing): runs save one since "
            "secagg 0.1 unless the algorithm has no PyTorch model (e.g. gmm)")
    info = json.loads(path.read_text())
    if info.get("format") != FORMAT:
        raise ConfigurationError(f"{path}: unknown model format {info.get('format')!r}")
    return info


def load_model(run_dir: str | Path, client: int | None = None) -> Any:
    """The model a run saved, ready for ``model(x)`` (in eval mode).

    For a global model, the ``nn.Module``. For a personalized algorithm (FedLog), a
    :class:`PersonalizedModels` (``models[client_id](x)``), or with ``client`` that
    client's module. Raises :class:`~secagg.errors.ConfigurationError` when the folder
    holds no model or the client has none.
    """
    import torch

    run = Path(run_dir)
    info = read_model_info(run)
    state = torch.load(run / MODEL_FILE, map_location="cpu", weights_only=True)

    def rebuilt(sd: Mapping[str, Any]) -> Any:
        m = build_from_recipe(info["recipe"])
        m.load_state_dict(sd)
        return m.eval()

    if client is not None:
        sd = state["clients"].get(str(int(client)))
        if sd is None:
            if state["global"] is not None and not state["clients"]:
                return rebuilt(state["global"])  # a global model serves every client
            raise ConfigurationError(f"{run}: no model for client {client}")
        return rebuilt(sd)
    if state["clients"]:
        return PersonalizedModels({int(k): rebuilt(sd)
                                   for k, sd in state["clients"].items()}).eval()
    if state["global"] is None:
        raise ConfigurationError(f"{run}: the saved model is empty")
    return rebuilt(state["global"])
