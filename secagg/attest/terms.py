"""The DP terms a party signs in its closing statement: written from a run's privacy ledger
(:func:`dp_terms`), rebuilt by the audit's own accountant (:func:`recompute_dp`), and
checked by a node against the releases it noised itself (:func:`check_applied`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from secagg.attest.statement import AttestationError


def dp_terms(privacy: Any) -> dict[str, Any]:
    """The DP terms a privacy ledger (:class:`secagg.privacy.accountant.PrivacyLedger`)
    holds, as a party signs them in its closing statement: the accountant's settings, each
    release's mechanism and parameters (noise multiplier, noise share and survivor count,
    ...) with the fields and phase it covers and why it is not private (a fixed noise seed),
    the fields released without noise, and every reason the run is not private. The
    audit's own accountant recomputes every epsilon from these (:func:`recompute_dp`)."""
    from secagg.errors import PrivacyError
    from secagg.privacy.client_ledger.events import event_to_dict

    events = []
    for e in privacy.events:
        try:
            d = event_to_dict(e)
        except PrivacyError:
            d = {"mechanism": getattr(e, "mechanism", "?"), "count": e.count,
                 "unsupported": True}
        d.update(fields=list(e.fields), phase=e.phase, round=e.round,
                 not_private_reason=e.not_private_reason)
        events.append(d)
    return {"delta": privacy.delta, "accountant": privacy.accountant,
            "pld_discretization": privacy.pld_discretization, "events": events,
            "unnoised": [[p, f, why] for (p, f), why in sorted(
                privacy.unnoised.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))],
            "not_private": list(privacy.not_private_reasons)}


def recompute_dp(terms: Mapping[str, Any]) -> Any:
    """A fresh :class:`~secagg.privacy.accountant.PrivacyLedger` holding the releases that
    ``terms`` (:func:`dp_terms`, as signed) describe: the audit's own accountant.

    Raises:
        AttestationError: terms that no accountant can rebuild (the message says which).
    """
    import dataclasses

    from secagg.errors import PrivacyError
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.client_ledger.events import event_from_dict

    try:
        led = PrivacyLedger(delta=terms.get("delta"),
                            accountant=str(terms.get("accountant", "auto")),
                            pld_discretization=float(terms.get("pld_discretization", 1e-4)))
        for d in terms.get("events", []):
            if d.get("unsupported"):
                raise AttestationError(f"a {d.get('mechanism')!r} release cannot be "
                                       "recomputed by any accountant")
            ev = dataclasses.replace(
                event_from_dict(d), fields=tuple(d.get("fields", ())), phase=d.get("phase"),
                round=d.get("round"), not_private_reason=str(d.get("not_private_reason", "")))
            led.extend([ev])
        for p, f, why in terms.get("unnoised", []):
            led.mark_unnoised(f, p, why)
        for why in terms.get("not_private", []):
            if why not in led.not_private_reasons:
                led.mark_not_private(why)
    except (PrivacyError, TypeError, ValueError, AttributeError) as exc:
        raise AttestationError(f"signed DP terms unreadable: {exc}") from None
    return led


def applied_release(round: int, phase: str, layer: str, fields: Iterable[str],
                    noise_multiplier: float | None, seeded: bool) -> dict[str, Any]:
    """What a node keeps about one release it noised itself (in its own state), checked
    against the DP terms it is asked to sign at the end of the run
    (:func:`check_applied`)."""
    return {"round": int(round), "phase": str(phase), "layer": str(layer),
            "fields": sorted(map(str, fields)),
            "noise_multiplier": None if noise_multiplier is None else float(noise_multiplier),
            "seeded": bool(seeded)}


def check_applied(terms: Mapping[str, Any] | None, applied: Iterable[Mapping[str, Any]]
                  ) -> list[str]:
    """Why DP terms (:func:`dp_terms`) misdescribe releases a party noised itself
    (:func:`applied_release`); [] when they cover every one: a release of that round and
    phase covering its fields, for ``local-dp`` a Gaussian event of the noise multiplier
    applied (an event of more noise would understate epsilon), and a release noised from
    a fixed seed marked not private."""
    def names(x: Any) -> set[str]:
        return {str(v) for v in x} if isinstance(x, list | tuple) else set()

    out: list[str] = []
    got = (terms or {}).get("events", []) if isinstance(terms or {}, Mapping) else []
    events = [e for e in got if isinstance(e, Mapping)] if isinstance(got, list) else []
    for a in applied:
        what = f"round {a.get('round')}, phase {a.get('phase')!r}"
        mine = [e for e in events if e.get("round") == a.get("round")
                and e.get("phase") == a.get("phase")
                and names(a.get("fields")) <= names(e.get("fields"))]
        if not mine:
            out.append(f"the terms leave out the release this party noised ({what}, fields "
                       f"{a.get('fields')})")
            continue
        z = a.get("noise_multiplier")
        if a.get("layer") == "local-dp" and z is not None and not any(
                e.get("mechanism") == "gaussian" and isinstance(
                    e.get("noise_multiplier"), int | float)
                and abs(float(e["noise_multiplier"]) - float(z)) <= 1e-9 * max(1.0, float(z))
                for e in mine):
            out.append(f"the terms describe the release of {what} with other noise than "
                       f"this party added (noise multiplier {z})")
        if a.get("seeded") and not (any(e.get("not_private_reason") for e in mine)
                                    or (terms or {}).get("not_private")):
            out.append(f"the terms call the release of {what} private, but this party's "
                       "noise came from a fixed seed")
    return out
