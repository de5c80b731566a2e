"""Homomorphic aggregation through TenSEAL (CKKS and BFV), packed, with explicit key roles.

* :class:`Homomorphic` -- the layer (:mod:`.layer`), its plan (:mod:`.plan`), one driver
  (:mod:`.remote`) and node steps (:mod:`.node`).
* :mod:`~secagg.homomorphic.params` -- parameter selection and the CKKS error bound.
* :mod:`~secagg.homomorphic.packing` -- packing uploads into slots; the ciphertext wire format.
* :mod:`~secagg.homomorphic.keys` -- the key holder, client and aggregator roles.
* :mod:`~secagg.homomorphic.errors` -- typed errors (all ``ProtocolError``).
"""

from secagg.homomorphic.errors import (
    CiphertextError,
    ForeignContextError,
    HomomorphicError,
    KeyRoleError,
)
from secagg.homomorphic.keys import Aggregator, Encryptor, KeyHolder
from secagg.homomorphic.layer import DECRYPTOR, Homomorphic
from secagg.homomorphic.packing import Packing
from secagg.homomorphic.params import HEParams, bfv_params, ckks_error_bound, ckks_params

__all__ = [
    "DECRYPTOR", "Aggregator", "CiphertextError", "Encryptor", "ForeignContextError",
    "HEParams", "Homomorphic", "HomomorphicError", "KeyHolder", "KeyRoleError", "Packing",
    "bfv_params", "ckks_error_bound", "ckks_params",
]
