"""Storing run state that is read back, without pickle: arrays and JSON, with a digest.

Anything secagg reads back from a run folder or a node's store (the sweep's statistics
cache, a Flower node's client state) goes through this module, so reading it can never
run code: arrays are kept in NumPy's ``.npz`` format and loaded with
``allow_pickle=False``; everything else is JSON; the few classes that may appear
(:class:`~secagg.layers.base.Aggregate`, :class:`~secagg.costs.CostRow`) are rebuilt
from an allow-list by their fields; a PyTorch module is kept as its ``state_dict``
arrays and loaded into a module the reader supplies (never constructed from the file).
Each stored item carries the SHA-256 of its bytes, checked before anything is decoded.

Files are written with mode 0600: a temporary file with a random name in the target's
folder, created with ``O_EXCL | O_NOFOLLOW`` (never an existing file or a planted link),
then an atomic rename. A target that is a symbolic link is refused (:class:`StoreError`),
when writing and when reading.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import secrets
import stat
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from secagg.errors import SecaggError

#: Magic of a blob made by :func:`dumps`.
MAGIC = b"SGS1"


class StoreError(SecaggError, ValueError):
    """Stored state that cannot be read back: a digest that does not match, a truncated
    file, or content outside the allowed format (which is never executed)."""


def _allowed() -> dict[str, type]:
    from secagg.costs import CostRow
    from secagg.layers.base import Aggregate

    return {"Aggregate": Aggregate, "CostRow": CostRow}


ModuleFor = Callable[[str, str], Any]
"""``(path in the object, class name) -> a module of that class to load the stored
state_dict into`` (or None: not available)."""


def encode(obj: Any, classes: Mapping[str, type] | None = None
           ) -> tuple[Any, dict[str, np.ndarray]]:
    """(JSON-able description, arrays by name) of ``obj``. ``classes``: dataclasses the
    caller allows besides the default ones (by name).

    Raises:
        StoreError: a value of a type this format does not hold.
    """
    arrays: dict[str, np.ndarray] = {}
    allowed = {**_allowed(), **(classes or {})}

    def put(a: np.ndarray) -> str:
        if a.dtype.hasobject:
            raise StoreError("object arrays are not stored (they would need pickle)")
        name = f"a{len(arrays)}"
        arrays[name] = np.ascontiguousarray(a)
        return name

    def enc(x: Any, path: str) -> Any:
        if x is None or isinstance(x, bool | str):
            return x
        if isinstance(x, int | float) and not isinstance(x, bool):
            return x
        if isinstance(x, bytes | bytearray):
            return {"__bytes__": put(np.frombuffer(bytes(x), dtype=np.uint8))}
        if isinstance(x, set | frozenset):
            return {"__set__": [enc(v, path) for v in sorted(x)]}
        if isinstance(x, np.ndarray):
            return {"__array__": put(x)}
        if isinstance(x, np.generic):
            return {"__scalar__": put(np.asarray(x))}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, f"{path}/{i}") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [enc(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: enc(v, f"{path}/{k}") for k, v in x.items()}
            return {"__items__": [[enc(k, path), enc(v, f"{path}/{k}")]
                                  for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and type(x).__name__ in allowed \
                and isinstance(x, allowed[type(x).__name__]):
            return {"__class__": type(x).__name__,
                    "fields": {f.name: enc(getattr(x, f.name), f"{path}/{f.name}")
                               for f in dataclasses.fields(x)}}
        mod = _torch_kind(x)
        if mod == "tensor":
            return {"__tensor__": put(x.detach().cpu().numpy())}
        if mod == "module":
            return {"__module__": type(x).__qualname__, "path": path,
                    "state": {k: put(v.detach().cpu().numpy())
                              for k, v in x.state_dict().items()}}
        raise StoreError(f"{path or 'value'}: a {type(x).__name__} is not stored in the "
                         "safe format (arrays, JSON, torch modules' state_dict)")

    return enc(obj, ""), arrays


def _torch_kind(x: Any) -> str | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, torch.nn.Module):
        return "module"
    return None


def decode(desc: Any, arrays: Mapping[str, np.ndarray],
           module_for: ModuleFor | None = None,
           classes: Mapping[str, type] | None = None) -> Any:
    """The object :func:`encode` described (``classes`` as there).

    Raises:
        StoreError: a reference to a missing array, a class outside the allow-list, or a
            module for which ``module_for`` gives none of that class.
    """
    allowed = {**_allowed(), **(classes or {})}

    def arr(name: Any) -> np.ndarray:
        if not isinstance(name, str) or name not in arrays:
            raise StoreError(f"reference to a missing array {name!r}")
        return arrays[name]

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__array__" in x:
            return np.array(arr(x["__array__"]), copy=True)
        if "__bytes__" in x:
            return arr(x["__bytes__"]).astype(np.uint8).tobytes()
        if "__set__" in x:
            return {_key(dec(v)) for v in x["__set__"]}
        if "__scalar__" in x:
            return arr(x["__scalar__"])[()]
        if "__tuple__" in x:
            return tuple(dec(v) for v in x["__tuple__"])
        if "__items__" in x:
            return {_key(dec(k)): dec(v) for k, v in x["__items__"]}
        if "__class__" in x:
            cls = allowed.get(x["__class__"])
            if cls is None:
                raise StoreError(f"class {x['__class__']!r} is not allowed in stored state")
            return cls(**{k: dec(v) for k, v in x["fields"].items()})
        if "__tensor__" in x:
            import torch

            return torch.from_numpy(np.array(arr(x["__tensor__"]), copy=True))
        if "__module__" in x:
            import torch

            model = module_for(x["path"], x["__module__"]) if module_for else None
            if model is None or type(model).__qualname__ != x["__module__"]:
                raise StoreError(f"{x['path']}: no {x['__module__']} to load the stored "
                                 "state into")
            model.load_state_dict({k: torch.from_numpy(np.array(arr(v), copy=True))
                                   for k, v in x["state"].items()})
            return model
        return {k: dec(v) for k, v in x.items()}

    return dec(desc)


def _key(k: Any) -> Any:
    return k if not isinstance(k, list) else tuple(k)


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _arrays(raw: bytes) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as exc:
        raise StoreError(f"arrays unreadable: {exc}") from None


def dumps(obj: Any, classes: Mapping[str, type] | None = None) -> bytes:
    """One blob: ``MAGIC``, u32 JSON length, JSON (the description and the SHA-256 of the
    arrays), then the ``.npz`` bytes."""
    desc, arrays = encode(obj, classes)
    npz = _npz(arrays)
    meta = json.dumps({"desc": desc, "sha256": hashlib.sha256(npz).hexdigest()}).encode()
    return MAGIC + struct.pack(">I", len(meta)) + meta + npz


def loads(raw: bytes, module_for: ModuleFor | None = None,
          classes: Mapping[str, type] | None = None) -> Any:
    """The object of a :func:`dumps` blob (digest checked first).

    Raises:
        StoreError: not such a blob, or its digest does not match.
    """
    if len(raw) < 8 or raw[:4] != MAGIC:
        raise StoreError("not a secagg safe-store blob")
    (n,) = struct.unpack(">I", raw[4:8])
    try:
        meta = json.loads(raw[8:8 + n])
    except ValueError as exc:
        raise StoreError(f"description unreadable: {exc}") from None
    npz = raw[8 + n:]
    if hashlib.sha256(npz).hexdigest() != meta.get("sha256"):
        raise StoreError("the stored arrays do not match their digest")
    return decode(meta.get("desc"), _arrays(npz), module_for, classes)


#: Attempts at a fresh temporary name before :func:`_write_private` gives up.
_TEMP_TRIES = 16


def _temp_name(path: Path) -> Path:
    """A temporary name beside ``path``: 128 random bits, so no other user can plant a
    file or link there in advance."""
    return path.with_name(f".{path.name}.{secrets.token_hex(16)}.tmp")


def _refuse_link(path: Path) -> None:
    """Raise :class:`StoreError` when ``path`` is a symbolic link (a store never writes or
    reads through one: a planted link would redirect it to another file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path} is a symbolic link: refused (a store writes and reads "
                         "only its own regular files; remove the link)")


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600: into a fresh temporary file in the same
    folder (random name, opened with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so neither a file
    nor a link planted there is followed or truncated), then renamed over ``path``.

    Raises:
        StoreError: ``path`` is a symbolic link, or no fresh temporary name was found.
    """
    _refuse_link(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_TRIES):
        tmp = _temp_name(path)
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:
            continue  # something is already there (a planted file or link): another name
        break
    else:
        raise StoreError(f"{path.parent}: no fresh temporary name in {_TEMP_TRIES} tries "
                         "(the folder is full of planted names?)")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _refuse_link(path)  # a link planted while we wrote
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save(path: str | os.PathLike[str], obj: Any) -> tuple[Path, Path]:
    """Write ``obj`` as ``<path>.npz`` (arrays) and ``<path>.json`` (the description, the
    arrays file's SHA-256 and the description's own), both mode 0600."""
    base = Path(path)
    desc, arrays = encode(obj)
    npz = _npz(arrays)
    body = json.dumps(desc, sort_keys=True)
    meta = {"format": "secagg-safestore-1", "arrays_sha256": hashlib.sha256(npz).hexdigest(),
            "desc_sha256": hashlib.sha256(body.encode()).hexdigest(), "desc": body}
    npz_path, json_path = base.with_suffix(".npz"), base.with_suffix(".json")
    _write_private(npz_path, npz)
    _write_private(json_path, json.dumps(meta).encode())
    return npz_path, json_path


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`save` wrote ``path``."""
    base = Path(path)
    return base.with_suffix(".json").exists() and base.with_suffix(".npz").exists()


def load(path: str | os.PathLike[str], module_for: ModuleFor | None = None,
         *, lazy: bool = False) -> Any:
    """What :func:`save` wrote at ``path`` (both digests checked before decoding).
    ``lazy``: return ``(description, arrays)`` undecoded (for :func:`decode` later, when
    the modules to load into exist).

    Raises:
        StoreError: a file missing, unreadable, a symbolic link, or not matching its
            digest.
    """
    base = Path(path)
    for p in (base.with_suffix(".json"), base.with_suffix(".npz")):
        _refuse_link(p)
    try:
        meta = json.loads(base.with_suffix(".json").read_text())
        npz = base.with_suffix(".npz").read_bytes()
    except (OSError, ValueError) as exc:
        raise StoreError(f"{base}: unreadable ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "secagg-safestore-1":
        raise StoreError(f"{base}: not a secagg safe-store file")
    body = meta.get("desc")
    if not isinstance(body, str) or \
            hashlib.sha256(body.encode()).hexdigest() != meta.get("desc_sha256"):
        raise StoreError(f"{base}.json: the description does not match its digest")
    if hashlib.sha256(npz).hexdigest() != meta.get("arrays_sha256"):
        raise StoreError(f"{base}.npz: the arrays do not match their digest")
    desc, arrays = json.loads(body), _arrays(npz)
    return (desc, arrays) if lazy else decode(desc, arrays, module_for)


def remove(path: str | os.PathLike[str]) -> None:
    """Delete what :func:`save` wrote at ``path``."""
    base = Path(path)
    for p in (base.with_suffix(".npz"), base.with_suffix(".json")):
        p.unlink(missing_ok=True)
