"""Per-group routing: a different layer for each field group of one upload.

TurboSVM-FL's encoder can be securely summed, but its server needs each client's class
embeddings; ``PerGroup({"encoder": SecureSum(), "embeddings": Plaintext()})`` carries each
group through its own layer and merges the results. Every group of the spec must be routed.

A DP layer inside a route books into the run's privacy ledger like a top-level one:
:meth:`PerGroup.make_privacy_ledger` gives the run one ledger for all DP routes (their events
compose in it), :meth:`PerGroup.plan_releases` passes the run's release count to each, and
:meth:`PerGroup.unnoised_fields` names the fields of groups routed through a layer that adds
no noise, so that the run is reported private only when every field is noised.
"""

from __future__ import annotations

from collections import Counter
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
        return tuple(dict.fromkeys(s for layer in self._layers() for s in layer.dropout_stages()))

    def _layer_for(self, group: str) -> Layer:
        layer = self.routes.get(group, self.default)
        if layer is None:
            raise ConfigurationError(
                f"no layer routed for field group {group!r}; routes: {sorted(self.routes)}"
            )
        return layer

    def _layers(self) -> list[Layer]:
        return [*self.routes.values(), *([self.default] if self.default is not None else [])]

    def _dp_layers(self) -> list[Layer]:
        """The routed layers that book DP releases (they plan them and make a ledger)."""
        unique = {id(lay): lay for lay in self._layers()}  # a layer routed twice counts once
        return [lay for lay in unique.values()
                if callable(getattr(lay, "plan_releases", None))
                and callable(getattr(lay, "make_privacy_ledger", None))]

    def plan_releases(self, releases: int) -> None:
        """Tell every DP route how many releases the run makes (rounds x phases): each is
        calibrated as if all of them went through it (conservative when a group is absent
        from some phase), times the number of groups it is routed for (one release each)."""
        times = Counter(id(lay) for lay in self._layers())
        for lay in self._dp_layers():
            lay.plan_releases(releases * times[id(lay)])  # type: ignore[attr-defined]

    def make_privacy_ledger(self) -> Any | None:
        """One ledger for the run in which every DP route's events compose (None when no
        route is a DP layer). Its delta is the routes' common delta; its budget the sum of
        their epsilon budgets (each route spends its own), or none when a route has none.

        Raises:
            PrivacyError: the DP routes use different deltas (no single guarantee).
        """
        ledgers = [lay.make_privacy_ledger() for lay in self._dp_layers()]  # type: ignore[attr-defined]
        ledgers = [led for led in ledgers if led is not None]
        if len(ledgers) <= 1:
            return ledgers[0] if ledgers else None
        from secagg.errors import PrivacyError
        from secagg.privacy.accountant import PrivacyLedger

        deltas = sorted({led.delta for led in ledgers}, key=lambda d: (d is None, d))
        if len(deltas) != 1:
            raise PrivacyError(
                f"the DP layers routed by PerGroup use different deltas {deltas}; give them "
                "the same delta so that the run has one (epsilon, delta) guarantee")
        budgets = [led.epsilon_budget for led in ledgers]
        budget = None if any(b is None for b in budgets) else float(sum(budgets))
        return PrivacyLedger(epsilon_budget=budget, delta=deltas[0])

    def unnoised_fields(self, spec: UploadSpec) -> dict[str, str]:
        """The fields no routed layer noises, each with its group, layer and reason."""
        out: dict[str, str] = {}
        for layer, sub in self._split(spec):
            group = sub.fields[0].group
            for name, why in layer.unnoised_fields(sub).items():
                out[name] = f"its group {group!r} is routed to layer {layer.name!r}: {why}"
        return out

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
