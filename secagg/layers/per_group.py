"""Per-group routing: a different layer for each field group of one upload.

TurboSVM-FL's encoder can be securely summed, but its server needs each client's class
embeddings; ``PerGroup({"encoder": SecureSum(), "embeddings": Plaintext()})`` carries each
group through its own layer and merges the results. Every group of the spec must be routed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from secagg.errors import ConfigurationError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec


class PerGroup(Layer):
    """Route each :attr:`Field.group <secagg.messages.Field.group>` to its own layer.

    Args:
        routes: group name -> layer. ``default`` (optional) catches groups not named.
    """

    name: ClassVar[str] = "per-group"

    def __init__(self, routes: Mapping[str, Layer], default: Layer | None = None) -> None:
        if not routes and default is None:
            raise ConfigurationError("PerGroup needs at least one route")
        self.routes = dict(routes)
        self.default = default

    def dropout_stages(self) -> tuple[str, ...]:
        """Every routed layer's stages, in first-seen order (a client's fate at a stage is
        the same in every group, as the draw depends on the stage name, not the group)."""
        layers = [*self.routes.values(), *([self.default] if self.default else [])]
        return tuple(dict.fromkeys(s for layer in layers for s in layer.dropout_stages()))

    def _layer_for(self, group: str) -> Layer:
        layer = self.routes.get(group, self.default)
        if layer is None:
            raise ConfigurationError(
                f"no layer routed for field group {group!r}; routes: {sorted(self.routes)}"
            )
        return layer

    def _split(self, spec: UploadSpec) -> list[tuple[Layer, UploadSpec]]:
        groups: dict[str, list[str]] = {}
        for f in spec.fields:
            groups.setdefault(f.group, []).append(f.name)
        return [(self._layer_for(g), spec.subset(names)) for g, names in groups.items()]

    def check(self, spec: UploadSpec) -> None:
        """Check every group's fields against the layer routed for that group."""
        for layer, sub in self._split(spec):
            layer.check(sub)

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Run each group's layer on that group's fields and merge the aggregates.
        ``contributors`` is the set of clients present in every group's result."""
        out = Aggregate(ctx.phase, ctx.round)
        contributors: set[int] | None = None
        for i, (layer, sub) in enumerate(self._split(spec)):
            # the client's compute is booked once, with its first group's message
            part_uploads = {
                c: u.derive({n: u[n] for n in sub.names}, sub, keep_costs=i == 0)
                for c, u in uploads.items()
            }
            agg = layer.aggregate(part_uploads, sub, ctx)
            out.sums.update(agg.sums)
            out.values.update(agg.values)
            out.notes.update(agg.notes)
            got = set(agg.contributors)
            contributors = got if contributors is None else contributors & got
        out.contributors = tuple(sorted(contributors or ()))
        return out

    def describe(self) -> dict[str, Any]:
        """Each group's layer description."""
        d: dict[str, Any] = {"name": self.name,
                             "routes": {g: lay.describe() for g, lay in self.routes.items()}}
        if self.default is not None:
            d["default"] = self.default.describe()
        return d
