"""Typed uploads: what a client sends, declared once and enforced everywhere.

A :class:`Field` names one array of an upload and declares its shape, dtype, whether the
server only needs its sum over clients (``additive``) and a :class:`Bound` on how much one
record (or one whole client) can contribute. An :class:`UploadSpec` is the ordered fields
of one phase. An :class:`Upload` is a client's validated values for a spec.

Every layer derives what it needs from these declarations: admissibility (secure summation
needs ``additive``), fixed-point plans (from bounds and the cohort size), DP sensitivity
(from bounds and adjacency), byte counts and audits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from secagg.errors import UploadError

Adjacency = Literal["record", "client"]
_DTYPES = ("float32", "float64", "int64")

#: The public bound on records per client the engine plans fixed-point encodings with when
#: the user gives none (``Federation(max_records=...)``). It is a constant, never a count
#: taken from the clients' data; a client holding more records is refused. Client-level DP
#: on a record-level bound never uses it: there the bound must be given explicitly.
DEFAULT_MAX_RECORDS = 10_000


@dataclass(frozen=True)
class Bound:
    """Bound on one contribution to a field: one record's, or one whole client's.

    Args:
        l2: bound on the L2 norm of one contribution (None if not declared).
        linf: bound on the largest absolute entry of one contribution (None if not declared).
        adjacency: ``"record"`` when the bound is on a single record's contribution (the
            client's value is a sum over its records), ``"client"`` when it bounds the whole
            client's value. DP sensitivity refers to this adjacency.
    """

    l2: float | None = None
    linf: float | None = None
    adjacency: Adjacency = "record"

    def __post_init__(self) -> None:
        if self.l2 is None and self.linf is None:
            raise ValueError("Bound needs at least one of l2 or linf")
        for name in ("l2", "linf"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"Bound.{name} must be a finite positive number, got {v!r}")
        if self.adjacency not in ("record", "client"):
            raise ValueError(
                f"Bound.adjacency must be 'record' or 'client', got {self.adjacency!r}"
            )

    def _scale(self, n_records: int) -> int:
        if self.adjacency == "client":
            return 1
        if n_records < 0:
            raise ValueError(f"n_records must be >= 0, got {n_records}")
        return n_records

    def client_l2(self, n_records: int) -> float | None:
        """Bound on the L2 norm of one client's whole value holding ``n_records`` records."""
        if self.l2 is None:
            return None
        return self.l2 * self._scale(n_records)

    def client_linf(self, n_records: int) -> float | None:
        """Bound on the largest absolute entry of one client's value (L2 bounds L-inf too)."""
        per = self.linf if self.linf is not None else self.l2
        assert per is not None
        if self.linf is not None and self.l2 is not None:
            per = min(self.linf, self.l2)
        return per * self._scale(n_records)


@dataclass(frozen=True)
class Field:
    """One named array of an upload.

    Args:
        name: field name, unique within its :class:`UploadSpec`.
        shape: array shape.
        dtype: ``"float32"``, ``"float64"`` or ``"int64"``.
        additive: keyword-only and required: True when the server needs only the sum over
            clients (the field must then be a sum over records: ``secagg check ALGORITHM``
            verifies it), False when it needs each client's own value. It has no default,
            because a wrong guess either way is silent: a non-additive field summed by
            SecureSum gives a wrong result, an additive one declared otherwise is refused by
            every summing layer.
        bound: bound on one contribution; required for DP noise and for integer encodings.
        group: routing group; :class:`secagg.layers.PerGroup` picks a layer per group.
        reason: for a non-additive field, why the server needs each client's own value;
            summing layers quote it when they refuse the field.
        dp_weight: keyword-only; this field's share of a DP release's budget when a DP
            layer noises it together with other fields (default 1: equal shares). A release
            of fields f with weights w_f noises each with sigma_f = z sqrt(W / w_f) Delta_f,
            W = sum of the weights, so that sum_f (Delta_f / sigma_f)^2 = 1 / z^2: the
            release is exactly one Gaussian mechanism of multiplier z whatever the weights.
            A small weight gives a field more noise (e.g. the clipped-client count of
            adaptive clipping, Andrew et al. NeurIPS 2021).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float64"
    bound: Bound | None = None
    group: str = "default"
    reason: str = ""
    additive: bool = field(kw_only=True)
    dp_weight: float = field(default=1.0, kw_only=True)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("Field.name must be a non-empty string")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"Field {self.name!r}: negative dimension in shape {self.shape}")
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"Field {self.name!r}: dtype must be one of {_DTYPES}, got {self.dtype!r}"
            )
        w = self.dp_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (
                math.isfinite(w) and w > 0):
            raise ValueError(f"Field {self.name!r}: dp_weight must be a positive number, "
                             f"got {w!r}")

    @property
    def size(self) -> int:
        """Number of scalar entries."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Plaintext size of the array in bytes."""
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def is_integer(self) -> bool:
        """True for integer dtypes (summed exactly)."""
        return np.dtype(self.dtype).kind == "i"


@dataclass(frozen=True)
class UploadSpec:
    """The ordered fields of one phase's upload.

    Args:
        fields: the fields, in order.
        max_records: a public bound on the number of records one client holds; it turns
            record-level bounds into per-client bounds (fixed-point plans need those). It
            must not be computed from the clients' data (the largest client's size is
            private); :meth:`Upload.validate` refuses a client holding more records.
    """

    fields: tuple[Field, ...]
    max_records: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"UploadSpec has duplicate field names: {names}")
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {self.max_records}")

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        """Field names in order."""
        return tuple(f.name for f in self.fields)

    @property
    def additive(self) -> tuple[Field, ...]:
        """The additive fields, in order."""
        return tuple(f for f in self.fields if f.additive)

    @property
    def non_additive(self) -> tuple[Field, ...]:
        """The non-additive fields, in order."""
        return tuple(f for f in self.fields if not f.additive)

    @property
    def nbytes(self) -> int:
        """Plaintext size of one upload in bytes."""
        return sum(f.nbytes for f in self.fields)

    def subset(self, names: tuple[str, ...] | list[str]) -> UploadSpec:
        """The spec restricted to ``names`` (order of this spec kept)."""
        wanted = set(names)
        return UploadSpec(tuple(f for f in self.fields if f.name in wanted), self.max_records)

    def client_linf(self, name: str) -> float:
        """Largest absolute entry one client's value of field ``name`` can have.

        Raises:
            ValueError: the field has no bound, or a record-level bound and no max_records.
        """
        f = self[name]
        if f.bound is None:
            raise ValueError(f"field {name!r} has no Bound; declare one on the Field")
        if f.bound.adjacency == "record":
            if self.max_records is None:
                raise ValueError(
                    f"field {name!r} has a record-level bound but the UploadSpec has no "
                    "max_records, so no per-client bound can be derived; declare a public "
                    "bound on records per client (UploadSpec(max_records=...) or "
                    "Federation(max_records=...))"
                )
            out = f.bound.client_linf(self.max_records)
        else:
            out = f.bound.client_linf(1)
        assert out is not None
        return out


class Upload(Mapping[str, np.ndarray]):
    """A client's validated values for an :class:`UploadSpec` (read-only arrays).

    Build one with :meth:`validate`; direct construction skips the checks.
    """

    __slots__ = ("_values", "client", "spec", "n_records", "clipped", "cpu_s", "flops")

    def __init__(
        self,
        values: Mapping[str, np.ndarray],
        spec: UploadSpec,
        client: int,
        n_records: int,
        clipped: Mapping[str, int] | None = None,
    ) -> None:
        self._values = MappingProxyType(dict(values))
        self.spec = spec
        self.client = client
        self.n_records = n_records
        self.clipped: dict[str, int] = dict(clipped or {})
        #: client CPU seconds spent computing the statistic (set by the engine; layers add
        #: it to the upload message's ledger row).
        self.cpu_s = 0.0
        #: estimated FLOPs of the client statistic (set by the engine).
        self.flops = 0.0

    def __getitem__(self, name: str) -> np.ndarray:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Upload(client={self.client}, fields={list(self._values)})"

    def derive(self, values: Mapping[str, np.ndarray], spec: UploadSpec,
               keep_costs: bool = True) -> Upload:
        """A new upload of the same client with other values (a layer's rewrite of this
        one), keeping its records, clip counts and, unless told not to, its CPU and FLOPs."""
        out = Upload(values, spec, self.client, self.n_records, self.clipped)
        if keep_costs:
            out.cpu_s, out.flops = self.cpu_s, self.flops
        return out

    @classmethod
    def validate(
        cls,
        spec: UploadSpec,
        values: Mapping[str, Any],
        client: int,
        n_records: int,
        on_violation: Literal["raise", "clip"] = "raise",
    ) -> Upload:
        """Check ``values`` against ``spec`` and return an immutable :class:`Upload`.

        Checks, per field: present, no extra fields, exact shape, dtype kind (an integer
        field must hold integers; float fields are cast to the declared float dtype), all
        finite, and the declared bound scaled to this client (``n_records`` records for a
        record-level bound). A bound violation raises unless ``on_violation="clip"``, in
        which case the value is scaled (L2) or clamped (L-inf) into the bound and the clip
        is counted in :attr:`clipped`.

        A client holding more records than the spec's public ``max_records`` is refused:
        every per-client bound derived from record-level bounds assumes it holds.

        Raises:
            UploadError: naming the client, the field and the problem.
        """
        if on_violation not in ("raise", "clip"):
            raise ValueError(f"on_violation must be 'raise' or 'clip', got {on_violation!r}")
        if spec.max_records is not None and n_records > spec.max_records and spec.fields:
            raise UploadError(
                client, spec.fields[0].name,
                f"the client holds {n_records} records, more than the public bound "
                f"max_records={spec.max_records} every per-client bound is derived from; "
                "raise max_records (a public parameter) or subsample the client's data",
            )
        extra = set(values) - set(spec.names)
        if extra:
            raise UploadError(client, sorted(extra)[0], f"not declared in the spec {spec.names}")
        out: dict[str, np.ndarray] = {}
        clipped: dict[str, int] = {}
        for f in spec.fields:
            if f.name not in values:
                raise UploadError(client, f.name, "missing from the upload")
            arr = _as_array(values[f.name], f, client)
            if f.bound is not None:
                arr, n_clip = _check_bound(arr, f, client, n_records, on_violation)
                if n_clip:
                    clipped[f.name] = n_clip
            arr.setflags(write=False)
            out[f.name] = arr
        return cls(out, spec, client, n_records, clipped)


def _as_array(value: Any, f: Field, client: int) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything unconvertible is a bad upload
        raise UploadError(client, f.name, f"not convertible to an array ({exc})") from exc
    if arr.shape != f.shape:
        raise UploadError(client, f.name, f"shape {arr.shape}, expected {f.shape}")
    kind = arr.dtype.kind
    if f.is_integer:
        if kind not in "iu" and kind != "b":
            raise UploadError(client, f.name, f"dtype {arr.dtype}, expected integer {f.dtype}")
        if kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise UploadError(client, f.name, "integer value exceeds int64")
        return np.array(arr, dtype=np.int64)
    if kind not in "fiub":
        raise UploadError(client, f.name, f"dtype {arr.dtype}, expected {f.dtype}")
    if kind == "f" and not np.all(np.isfinite(arr)):
        bad = "NaN" if np.isnan(arr).any() else "inf"
        raise UploadError(client, f.name, f"contains {bad}")
    if kind == "f" and arr.dtype.itemsize > np.dtype(f.dtype).itemsize:
        # Narrowing (e.g. float64 -> float32) must not overflow to inf.
        with np.errstate(over="ignore"):
            cast = arr.astype(f.dtype)
        if not np.all(np.isfinite(cast)):
            raise UploadError(client, f.name, f"value overflows {f.dtype}")
        return cast
    return np.array(arr, dtype=f.dtype)


def _check_bound(
    arr: np.ndarray, f: Field, client: int, n_records: int, on_violation: str
) -> tuple[np.ndarray, int]:
    b = f.bound
    assert b is not None
    l2 = b.client_l2(n_records)
    linf = b.linf * (1 if b.adjacency == "client" else n_records) if b.linf is not None else None
    clips = 0
    x = arr.astype(np.float64) if not f.is_integer else arr
    if linf is not None and x.size:
        worst = float(np.max(np.abs(x)))
        if worst > linf * (1 + 1e-12):
            if on_violation == "raise":
                raise UploadError(
                    client, f.name, f"max |entry| {worst:.6g} exceeds the L-inf bound {linf:.6g}"
                )
            lim = np.floor(linf) if f.is_integer else linf
            arr = np.clip(arr, -lim, lim).astype(arr.dtype)
            clips += 1
    if l2 is not None and x.size:
        norm = float(np.linalg.norm(np.asarray(arr, dtype=np.float64).ravel()))
        if norm > l2 * (1 + 1e-12):
            if on_violation == "raise" or f.is_integer:
                raise UploadError(
                    client, f.name, f"L2 norm {norm:.6g} exceeds the L2 bound {l2:.6g}"
                )
            arr = (arr * (l2 / norm) * (1 - 1e-12)).astype(arr.dtype)
            clips += 1
    return arr, clips


def array_nbytes(values: Mapping[str, np.ndarray]) -> int:
    """Total plaintext bytes of a mapping of arrays."""
    return int(sum(np.asarray(v).nbytes for v in values.values()))


@dataclass
class ClipReport:
    """How many uploads were clipped, per field (filled when clipping was asked for)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, upload: Upload) -> None:
        """Count the clips of one upload."""
        for k, v in upload.clipped.items():
            self.counts[k] = self.counts.get(k, 0) + v
