"""One client step, written once: the phase's step on one client's data, its CPU time, the
upload check against the phase's spec, and the clip count.

Every runtime runs a client's step through :func:`run_step`: the embedded engine for each
client of a cohort (:meth:`secagg.engine.Engine._in_process`, whose uploads a
:class:`~secagg.local_link.LocalLink` hands to the layer's driver) and for a local phase
(:meth:`secagg.engine.Engine._local`), and a Flower node (:mod:`secagg.flower.client`). The
reply fields a node sends with its upload come from :func:`reply_fields` on both runtimes.

What one step does, in order:

1. the phase's ``client_step(client, broadcast)`` (a halted client runs none: its upload is
   zeros), timed with :func:`time.process_time`;
2. the phase's ``client_cpu_s(client, measured)`` hook
   (:meth:`secagg.phase.PhaseBase.client_cpu_s`; by default the measured time) books shared
   work (a batched chunk's training) to the client;
3. the values are checked against the spec (:meth:`~secagg.messages.Upload.validate`, with
   the run's ``on_violation``); a phase with no upload fields must return ``{}``;
4. an optional ``screen`` (the client's own individual privacy filter) may replace the
   upload;
5. the upload carries its CPU seconds and the phase's FLOP estimate, and its clips are
   counted in the run's :class:`~secagg.messages.ClipReport` when one is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import numpy as np

from secagg.errors import ConfigurationError
from secagg.messages import ClipReport, Upload, UploadSpec
from secagg.stages import Key

__all__ = ["StepPhase", "reply_fields", "run_step", "zeros"]


class StepPhase(Protocol):
    """What :func:`run_step` asks of a phase (declared with its defaults on
    :class:`secagg.phase.PhaseBase`)."""

    name: str

    def client_step(self, client: Any, broadcast: Mapping[str, np.ndarray]
                    ) -> Mapping[str, Any]:
        """One client's upload values from the broadcast and its own data."""
        ...

    def client_flops(self, client: Any) -> float:
        """The FLOP estimate of the client's step."""
        ...

    def client_cpu_s(self, client: Any, measured: float) -> float:
        """The client's CPU seconds, given what its step measured."""
        ...


def zeros(spec: UploadSpec) -> dict[str, np.ndarray]:
    """An all-zero upload of ``spec`` (a halted client's, or one its filter silenced)."""
    return {f.name: np.zeros(f.shape, dtype=f.dtype) for f in spec.fields}


def run_step(
    phase: StepPhase,
    client: Any,
    broadcast: Mapping[str, np.ndarray],
    spec: UploadSpec | Callable[[], UploadSpec],
    *,
    on_violation: Literal["raise", "clip"] = "raise",
    halted: bool = False,
    screen: Callable[[UploadSpec, Upload], Upload] | None = None,
    clips: ClipReport | None = None,
) -> Upload:
    """Run ``phase``'s step for ``client`` and return its checked upload (see the module
    docstring for the order of the parts).

    Args:
        phase: the phase whose step runs.
        client: the client's state (:class:`~secagg.phase.ClientState`: ``id``,
            ``n_records``, its data and private state).
        broadcast: what the server sent for this phase.
        spec: the spec the upload is checked against, or a function that gives it after
            the step (a phase whose bound comes with the broadcast declares it then; the
            function may refuse a spec that changed during the step).
        on_violation: a bound violation raises (``"raise"``) or is clipped and counted.
        halted: the client runs no step and uploads zeros (its filter stopped it).
        screen: called with (spec, upload) after the check when the client stepped; returns
            the upload that leaves (the client's individual filter).
        clips: the run's clip count, which this upload's clips join (None: counted by
            whoever receives it).

    Returns:
        The validated :class:`~secagg.messages.Upload`, with ``cpu_s`` and ``flops`` set.

    Raises:
        UploadError: the values break the spec (``on_violation="raise"``, or a shape, dtype,
            NaN or record-count problem).
        ConfigurationError: a phase with no upload fields returned values.
    """
    t0 = time.process_time()
    if halted:
        values: Mapping[str, Any] = zeros(spec if isinstance(spec, UploadSpec) else spec())
    else:
        values = phase.client_step(client, broadcast)
    cpu = time.process_time() - t0
    if not halted:  # shared work (a batched chunk's) booked to this client
        cpu = float(phase.client_cpu_s(client, cpu))
    checked = spec if isinstance(spec, UploadSpec) else spec()
    if not checked.fields and values:
        raise ConfigurationError(
            f"phase {phase.name!r} declares no upload fields but its client step "
            f"returned {sorted(values)}: a local phase must return {{}}")
    up = Upload.validate(checked, values, client.id, client.n_records, on_violation)
    if screen is not None and not halted:
        up = screen(checked, up)
    up.cpu_s, up.flops = cpu, float(phase.client_flops(client))
    if clips is not None:
        clips.add(up)
    return up


def reply_fields(up: Upload) -> dict[str, Any]:
    """The client step's fields of a node's reply: its CPU seconds, FLOP estimate and clip
    counts (JSON), which the layer's driver books and counts."""
    return {Key.CPU_S: float(up.cpu_s), Key.FLOPS: float(up.flops),
            Key.CLIPPED: json.dumps(up.clipped)}
