"""The parties' Ed25519 identities: public keys as hex, the identities file an auditor
trusts (read from outside the transcript), and pinned private keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from secagg.attest.statement import SCHEME, SCHEME_V1, AttestationError
from secagg.errors import ConfigurationError


def public_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key, hex."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


class Identities(dict):  # type: ignore[type-arg]
    """``{party (as a string): Ed25519 public key}`` read from outside the transcript, with
    the attestation ``scheme`` the file names (:data:`SCHEME_V1` when it names none, as a
    bare PKI mapping) and the ``path`` it came from (None: built in memory)."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], *, scheme: str = SCHEME_V1,
                 path: Path | None = None) -> None:
        super().__init__(keys)
        self.scheme = scheme
        self.path = path


def write_identities(path: str | Path, keys: Mapping[Any, str], *,
                     scheme: str = SCHEME_V1) -> Path:
    """Write ``{party: public key hex}`` as an identities file (parties as strings), naming
    ``scheme`` (:data:`SCHEME` when every party signs sequence numbers and a closing
    statement: the audit then requires them)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"scheme": scheme, "keys": {str(k): v for k, v in keys.items()}},
                            indent=2, sort_keys=True) + "\n")
    return p


def read_identities(path: str | Path) -> Identities:
    """The :class:`Identities` of an identities file.

    Raises:
        AttestationError: not such a file, a key that is not 32 hex bytes, or an unknown
            scheme.
    """
    try:
        doc = json.loads(Path(path).read_text())
        keys = doc["keys"] if isinstance(doc, dict) and "keys" in doc else doc
        scheme = doc.get("scheme", SCHEME_V1) if isinstance(doc, dict) and "keys" in doc \
            else SCHEME_V1
        out = {str(k): Ed25519PublicKey.from_public_bytes(bytes.fromhex(v))
               for k, v in keys.items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise AttestationError(f"{path}: not an identities file ({exc})") from None
    if scheme not in (SCHEME_V1, SCHEME):
        raise AttestationError(f"{path}: unknown attestation scheme {scheme!r}")
    return Identities(out, scheme=scheme, path=Path(path))


def load_pinned(keys: Mapping[Any, Any] | None) -> dict[Any, Ed25519PrivateKey]:
    """Private keys usable as identities (``SecureSum(identities=...)``), else {}."""
    if not keys:
        return {}
    if not all(isinstance(k, Ed25519PrivateKey) for k in keys.values()):
        raise ConfigurationError("identities must map parties to Ed25519 private keys")
    return dict(keys)
