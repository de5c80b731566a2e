"""Record-level DP-SGD for local training, through Opacus, accounted in the run's ledger.

An algorithm that trains locally wraps its plain PyTorch model, optimizer and data loader
with :func:`make_private` (Opacus ``PrivacyEngine``: per-sample gradient clipping to
``max_grad_norm``, Gaussian noise of std ``noise_multiplier * max_grad_norm``, Poisson
sampling of batches). After training, :meth:`PrivateTraining.events` turns Opacus'
history of (noise multiplier, sampling rate, steps) into :class:`SampledGaussianEvent`s,
which the same :class:`PrivacyLedger` composes with the statistics releases, so the run's
epsilon covers both.

Federated use, record-level adjacency: each record lives on one client, so within a round
the clients' trainings compose in parallel; :func:`round_event` gives the one event that
dominates all of them (largest sampling rate and step count, smallest multiplier), to be
spent once per round. Before training, :meth:`DPSGD.event` gives the planned event so the
budget guard can refuse a round before it runs.

Noise: not Opacus' ``torch.Generator`` (a Mersenne Twister; Opacus' ``secure_mode`` needs
torchcsprng, which is not installed) but the DP layers' own
:func:`~secagg.privacy.samplers.noise_generator` -- AES-128-CTR keyed from ``os.urandom`` --
which the wrapped optimizer's ``add_noise`` draws from (same law: N(0, (z C)^2) per
coordinate of the summed clipped gradient). The Poisson sampling masks come from a torch
generator seeded with 64 bits from ``secrets``, not from torch's global generator (which
runs seed from their public seed). Opacus' "Secure RNG turned off" warning is therefore
silenced: its own generator draws neither. Every :func:`make_private` call (one per client and
round in a federation) gets fresh keys, so no two trainings share a stream.

A user seed (``DPSGD(seed=...)``) makes both reproducible: each training's streams are
derived from (seed, ``stream``), ``stream`` naming the training (the engine passes one per
client and round), so they still differ between clients and rounds, but anyone who knows
the seed can predict them. The events of such a training carry a ``not_private_reason``,
and the ledger that records them marks the run not private.
"""

from __future__ import annotations

import math
import secrets
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.errors import PrivacyError
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.events import SampledGaussianEvent
from secagg.privacy.samplers import NoiseSource, noise_generator

__all__ = ["DPSGD", "PrivateTraining", "calibrate_dpsgd", "make_private", "planned_round_event",
           "round_event"]


@dataclass(frozen=True)
class DPSGD:
    """The DP-SGD option of a locally training algorithm.

    Args:
        noise_multiplier: z, noise std over the clipping norm.
        max_grad_norm: per-sample gradient L2 clipping norm.
        seed: make the noise and the Poisson sampling reproducible (experiments only:
            each training's streams are derived from this seed and its ``stream``, and any
            ledger that records its events marks the run not private).
    """

    noise_multiplier: float
    max_grad_norm: float
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise PrivacyError(f"DPSGD.{name} must be a positive number, got {v!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise PrivacyError(f"DPSGD.seed must be a non-negative integer, got {self.seed!r}")

    def event(self, n_records: int, batch_size: int, epochs: int, **where: Any
              ) -> SampledGaussianEvent:
        """The planned event of one client's local training: sampling rate
        batch_size / n_records, epochs * ceil(n_records / batch_size) steps."""
        if n_records < 1 or batch_size < 1 or epochs < 1:
            raise PrivacyError("n_records, batch_size and epochs must be positive")
        q = min(1.0, batch_size / n_records)
        steps = epochs * math.ceil(n_records / batch_size)
        where.setdefault("not_private_reason", self.not_private_reason)
        return SampledGaussianEvent(noise_multiplier=float(self.noise_multiplier),
                                    sampling_rate=q, steps=steps, label="dp-sgd", **where)

    @property
    def not_private_reason(self) -> str:
        """Why trainings with this configuration are not private ("" when they are)."""
        if self.seed is None:
            return ""
        return (f"dp-sgd: noise and sampling seed fixed by the user (seed={self.seed}): "
                "the noise is predictable")


@dataclass
class PrivateTraining:
    """What :func:`make_private` returns: Opacus' wrapped module, DP optimizer and
    Poisson-sampling loader, plus the engine whose history becomes ledger events."""

    module: Any
    optimizer: Any
    data_loader: Any
    engine: Any
    config: DPSGD
    #: where the Gaussian noise is drawn from (its ``private`` says whether it is secret)
    noise: NoiseSource | None = None

    def events(self, **where: Any) -> list[SampledGaussianEvent]:
        """One :class:`SampledGaussianEvent` per (multiplier, rate) block of Opacus'
        accountant history so far (``where``: round=, phase=, fields=, label=). With a user
        seed the events carry the configuration's ``not_private_reason``."""
        where.setdefault("label", "dp-sgd")
        where.setdefault("not_private_reason", self.config.not_private_reason)
        out = []
        for z, q, steps in self.engine.accountant.history:
            out.append(SampledGaussianEvent(noise_multiplier=float(z), sampling_rate=float(q),
                                            steps=int(steps), **where))
        return out

    def record(self, ledger: PrivacyLedger, **where: Any) -> list[SampledGaussianEvent]:
        """Spend this training's events on ``ledger`` (a seeded training's events mark it
        not private). Single-training use: a federation spends :func:`round_event` of the
        round's trainings once per round instead (the engine does)."""
        evs = self.events(**where)
        ledger.spend(*evs)
        return evs


def make_private(model: Any, optimizer: Any, data_loader: Any, config: DPSGD,
                 stream: int | str | None = None) -> PrivateTraining:
    """Wrap a plain torch model, optimizer and DataLoader for record-level DP-SGD (Opacus,
    Poisson sampling, flat clipping). Train with the returned module/optimizer/loader.

    ``stream`` names this training (e.g. a number unique to the client and round); it is
    used only with a user seed, to derive this training's own reproducible streams from
    (seed, stream). Without a seed every call draws fresh secret keys."""
    import torch
    from opacus import PrivacyEngine

    if not isinstance(config, DPSGD):
        raise PrivacyError(f"config must be a DPSGD, got {config!r}")
    if isinstance(stream, np.integer):
        stream = int(stream)
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, (int, str))):
        raise PrivacyError(f"stream must be an int or a string, got {stream!r}")
    if config.seed is None:
        noise_seed = sampling_seed = None
    else:
        from secagg.seeds import derive_seed

        parts = (config.seed, "" if stream is None else stream)
        noise_seed = derive_seed(*parts, "dp-sgd noise")
        sampling_seed = derive_seed(*parts, "dp-sgd sampling")
    # Poisson sampling must be secret too (amplification by subsampling assumes it): Opacus
    # draws the masks from ``engine.secure_rng`` when set, else from torch's global generator,
    # which a run seeds from its public seed. Give it its own generator, seeded with 64 bits
    # from ``secrets`` (or derived from the user seed).
    sampling = torch.Generator()
    sampling.manual_seed(secrets.randbits(64) if sampling_seed is None else sampling_seed)
    with warnings.catch_warnings():
        # Opacus warns "Secure RNG turned off" whenever secure_mode is off. Here that is
        # misleading: its generator draws nothing that matters. The noise comes from
        # _draw_noise_from (AES-128-CTR keyed from os.urandom) and the Poisson masks from
        # the generator seeded from ``secrets`` above (see the module docstring).
        warnings.filterwarnings("ignore", message=r"Secure RNG turned off")
        engine = PrivacyEngine(accountant="rdp")
    engine.secure_rng = sampling  # read only by the Poisson data loader (secure_mode is off)
    module, opt, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=data_loader,
        noise_multiplier=float(config.noise_multiplier),
        max_grad_norm=float(config.max_grad_norm), poisson_sampling=True,
    )
    noise = noise_generator(noise_seed)
    _draw_noise_from(opt, noise.rng)
    return PrivateTraining(module, opt, loader, engine, config, noise)


def _draw_noise_from(optimizer: Any, rng: np.random.Generator) -> None:
    """Make an Opacus ``DPOptimizer`` add its Gaussian noise from ``rng`` (same law as
    Opacus' ``add_noise``: std ``noise_multiplier * max_grad_norm`` per coordinate of each
    parameter's summed clipped gradient), keeping Opacus' processed-gradient checks."""
    import torch
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    def add_noise(self: Any) -> None:
        std = float(self.noise_multiplier * self.max_grad_norm)
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            g = p.summed_grad
            noise = rng.normal(0.0, std, size=tuple(g.shape)) if std > 0 else 0.0
            p.grad = (g + torch.as_tensor(noise, dtype=g.dtype, device=g.device)).view_as(p)
            _mark_as_processed(p.summed_grad)

    if not hasattr(optimizer, "add_noise") or not hasattr(optimizer, "params"):
        raise PrivacyError("expected an Opacus DPOptimizer")
    optimizer.add_noise = types.MethodType(add_noise, optimizer)


def round_event(events: Sequence[SampledGaussianEvent], **where: Any) -> SampledGaussianEvent:
    """One event dominating the clients' DP-SGD events of a round (parallel composition
    over disjoint records): smallest multiplier, largest sampling rate, most steps."""
    if not events:
        raise PrivacyError("round_event needs at least one event")
    where.setdefault("label", "dp-sgd")
    reasons = dict.fromkeys(e.not_private_reason for e in events if e.not_private_reason)
    where.setdefault("not_private_reason", "; ".join(reasons))
    return SampledGaussianEvent(
        noise_multiplier=min(e.noise_multiplier for e in events),
        sampling_rate=max(e.sampling_rate for e in events),
        steps=max(e.steps * e.count for e in events), **where)


def planned_round_event(config: DPSGD, sizes: Sequence[int], batch_size: int, epochs: int,
                        **where: Any) -> SampledGaussianEvent:
    """The event a round of DP-SGD trainings will at most spend, before any runs: the
    :func:`round_event` over every client (``sizes``: the clients' training-set sizes; any
    cohort drawn from them spends no more) of the event :func:`make_private` records for
    it. That is Opacus' accounting: a loader of ``ceil(n / batch_size)`` batches is
    Poisson-sampled at rate 1 / ceil(n / batch_size), for that many steps per epoch (the
    rate is at most :meth:`DPSGD.event`'s batch_size / n)."""
    if batch_size < 1 or epochs < 1:
        raise PrivacyError("batch_size and epochs must be positive")
    sizes = [int(n) for n in sizes if int(n) > 0]
    if not sizes:
        raise PrivacyError("planned_round_event needs at least one non-empty client")
    events = []
    for n in sizes:
        batches = math.ceil(n / batch_size)
        events.append(SampledGaussianEvent(
            noise_multiplier=float(config.noise_multiplier), sampling_rate=1.0 / batches,
            steps=epochs * batches, label="dp-sgd",
            not_private_reason=config.not_private_reason))
    return round_event(events, **where)


def calibrate_dpsgd(target_epsilon: float, delta: float, rounds: int, sizes: Sequence[int],
                    batch_size: int, epochs: int, max_grad_norm: float,
                    seed: int | None = None) -> DPSGD:
    """The DP-SGD configuration with the smallest noise multiplier whose ``rounds``
    planned round events (:func:`planned_round_event`) are (target_epsilon, delta)-DP.

    Raises:
        PrivacyError: bad arguments, or no multiplier reaches the target.
    """
    from secagg.privacy.calibrate import calibrate

    probe = planned_round_event(DPSGD(1.0, max_grad_norm, seed), sizes, batch_size, epochs)

    def event(z: float) -> SampledGaussianEvent:
        return SampledGaussianEvent(noise_multiplier=z, sampling_rate=probe.sampling_rate,
                                    steps=probe.steps, label="dp-sgd")

    z = calibrate(target_epsilon, delta, rounds=rounds, event=event)
    return DPSGD(z, max_grad_norm, seed)
