"""Privacy layers: each turns a cohort's uploads into the server's :class:`Aggregate`."""

from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.layers.per_group import PerGroup
from secagg.layers.plaintext import Plaintext

__all__ = ["Aggregate", "Layer", "PerGroup", "Plaintext", "RoundContext"]
