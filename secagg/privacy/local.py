"""LocalDP: each client adds Gaussian noise to its own upload before it leaves; the inner
layer carries the noised uploads under a spec whose bounds include the noise."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from secagg.layers.base import (
    Aggregate,
    NodePart,
    RoundContext,
    ServerPart,
)
from secagg.messages import Bound, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.dp_base import _DPLayer, _DPPart
from secagg.privacy.events import GaussianEvent
from secagg.privacy.noise import noise_tail
from secagg.privacy.samplers import gaussian


class LocalDP(_DPLayer):
    """Each client adds Gaussian noise to its own upload before it leaves (local DP).

    Every client's upload is by itself a Gaussian mechanism with multiplier z, so the
    guarantee holds even against a server that reads uploads individually; the sum carries
    n times the variance of :class:`CentralDP`. Non-additive fields may be noised too. The
    inner layer sees a spec whose bounds include the noise (a 2^-40 tail bound).
    """

    name: ClassVar[str] = "local-dp"
    holds_against: ClassVar[tuple[str, ...]] = (
        "observers of the releases", "a server that follows the protocol, which sees "
        "only noised uploads (it knows the cohort; no amplification is claimed); against "
        "a server that lies about the noise terms only where each client holds its own "
        "floor (a Flower node's NodePolicy; in one process the clients are this library's "
        "code)")
    allow_non_additive: ClassVar[bool] = True

    def _wide_spec(self, spec: UploadSpec, sigmas: Mapping[str, float]) -> UploadSpec:
        fields = []
        for f in spec.fields:
            if f.name in sigmas:
                base = spec.client_linf(f.name)
                tail = noise_tail(sigmas[f.name], f.size) + (0.5 if f.is_integer else 0.0)
                f = dataclasses.replace(f, bound=Bound(linf=base + tail, adjacency="client"))
            fields.append(f)
        return UploadSpec(tuple(fields), spec.max_records)

    def _check_inner(self, spec: UploadSpec) -> None:
        noised = self._noised(spec)
        if self.releases is None or not noised:
            self.inner.check(spec)
            return
        self.inner.check(self._wide_spec(spec, self._sigmas(spec, noised)))

    noise_scaling: ClassVar[str] = "local"

    def planned_sum_sigmas(self, spec: UploadSpec, cohort: int) -> dict[str, float]:
        """Each client's noise, summed over ``cohort`` clients: sigma sqrt(cohort)."""
        sigmas, _ = self.noise_plan(spec)
        return {f: s * math.sqrt(cohort) for f, s in sigmas.items()}

    def noise_plan(self, spec: UploadSpec) -> tuple[dict[str, float], UploadSpec]:
        """(sigma per noised field, the spec the inner layer carries: bounds widened by the
        noise's tail). Both sides compute it: a client to noise its upload, the aggregator
        to run the inner layer. No noised field: ({}, ``spec``)."""
        noised = self._noised(spec)
        if not noised:
            return {}, spec
        sigmas = self._sigmas(spec, noised)
        return sigmas, self._wide_spec(spec, sigmas)

    def noise_upload(self, up: Upload, spec: UploadSpec, sigmas: Mapping[str, float],
                     wide: UploadSpec, rng: np.random.Generator) -> Upload:
        """One client's noised upload (its side, before the upload leaves): Gaussian noise
        of ``sigmas`` on each noised field (rounded for integer fields), checked against
        the widened spec ``wide``."""
        values: dict[str, np.ndarray] = {}
        for f in spec.fields:
            v = np.asarray(up[f.name])
            if f.name in sigmas:
                v = v + gaussian(sigmas[f.name], f.shape, rng)
                v = np.rint(v).astype(np.int64) if f.is_integer else v.astype(f.dtype)
            values[f.name] = v
        nu = up.derive(values, wide)
        nu.cpu_s, nu.flops = up.cpu_s, up.flops
        return nu

    def spend(self, ledger: PrivacyLedger, sigmas: Mapping[str, float],
              ctx: RoundContext) -> None:
        """The aggregator's accounting of one release: one Gaussian event (every client's
        upload is by itself a Gaussian mechanism of multiplier z)."""
        ledger.spend(GaussianEvent(noise_multiplier=self.noise_multiplier, round=ctx.round,
                                   phase=ctx.phase, fields=tuple(sigmas), label=self.name))

    def release_notes(self, spec: UploadSpec, sigmas: Mapping[str, float], private: bool,
                      contributors: int) -> dict[str, Any]:
        """The aggregate's ``notes["dp"]`` for a release summed over ``contributors``."""
        return self._notes(spec, sigmas, "gaussian", private,
                           sum_sigma={f: s * math.sqrt(contributors) for f, s in sigmas.items()})

    def server_part(self, spec: UploadSpec, ctx: RoundContext, n: int) -> ServerPart:
        """Begin a release: spend its event up front; the inner layer carries the noised
        uploads (the widened spec) and the part's end notes the noise the sum carries."""
        return _LocalPart(self, spec, ctx)

    def node_part(self, rng: np.random.Generator, *, sizing: str = "server") -> NodePart:
        """The client's side: noise its own upload before it leaves."""
        return _LocalNoise(self, rng)


class _LocalPart(_DPPart):
    """LocalDP's server part: the release is spent first; the clients noise their uploads;
    the inner layer carries the widened spec."""

    def __init__(self, layer: LocalDP, spec: UploadSpec, ctx: RoundContext) -> None:
        super().__init__(layer, spec, ctx)
        self.sigmas, self.carried = layer.noise_plan(spec)
        if self.sigmas:
            layer.spend(self.ledger, self.sigmas, ctx)
            self.node_params = json.dumps(layer.node_params())
            self._noised(list(self.sigmas))

    def end(self, agg: Aggregate, ctx: RoundContext) -> Aggregate:
        """Note the noise the sum carries."""
        if self.sigmas:
            agg.notes["dp"] = self.layer.release_notes(self.spec, self.sigmas,
                                                       self.layer.seed is None,
                                                       len(agg.contributors))
        return agg


class _LocalNoise(NodePart):
    """LocalDP's node part: Gaussian noise on the client's own upload."""

    def __init__(self, layer: LocalDP, rng: np.random.Generator) -> None:
        self.layer, self.rng = layer, rng
        self.name = layer.name
        self.noise_multiplier = float(layer.noise_multiplier)
        self.seeded = layer.seed is not None
        self.upload_noised: tuple[str, ...] | None = ()

    def prepare(self, up: Upload, spec: UploadSpec) -> tuple[Upload, UploadSpec]:
        """The noised upload and the widened spec (the upload as it is when nothing is
        noised)."""
        sigmas, wide = self.layer.noise_plan(spec)
        self.upload_noised = tuple(sorted(sigmas))
        if not sigmas:
            return up, spec
        return self.layer.noise_upload(up, spec, sigmas, wide, self.rng), wide
