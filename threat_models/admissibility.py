"""Does a layer protect each field against a coalition?

:func:`admissible` walks an algorithm's upload fields through a layer's description
(``layer.describe()``, the same dict a transcript header carries, so a finished run can be
judged too) and returns one :class:`Verdict` per (phase, field): what the coalition can
read, whether that is more than the layer promises, and why.

What each layer promises, and the rules applied (n is the cohort, t the colluding clients):

* ``plaintext``: nothing. A coalition with the server reads every upload in the clear.
* ``secure-sum``: the server learns only the sum (Bonawitz et al. 2017). It breaks when the
  server and t >= T_s colluding clients pool their Shamir shares of a client's self-mask seed
  and mask key (T_s the share threshold: the threshold count on the complete graph, the
  per-neighbourhood one on the SecAgg+ graph); when only one honest client remains
  (n - t <= 1, the sum minus the colluders' inputs is its upload); and against an active
  server (this implementation is the semi-honest protocol: there is no signed consistency
  round, so a server may claim a live client dropped to some clients and ask others for
  its self-mask shares).
* ``homomorphic``: the server holds only the public context. It breaks when the secret-key
  holder joins the server (the decryptor, or with ``key_holder="clients"`` any one client),
  and against an active server (it could submit a single client's ciphertext as the "sum").
* ``central-dp``: only what leaves the aggregator is noised; a coalition with the server
  sees the un-noised sum (and whatever the inner layer shows it).
* ``local-dp``: each upload is noised before it leaves; nobody sees an un-noised value.
* ``distributed-dp``: the inner secure sum's rules; in addition the colluders know their own
  noise shares, so the honest noise covers the target only while n - t >= T (the noise was
  sized for T survivors).
* ``per-group``: each field follows the layer routed for its group.

Fields a layer lists as ``public`` are not noised: the inner layer's rule applies.

Across releases (:mod:`threat_models.differencing`): a field the algorithm declares
round-invariant (:meth:`algorithms.base.Phase.round_invariant_fields`) that the coalition
reads as an exact sum in two or more rounds, over cohorts that can differ (client sampling
with ``fraction < 1``, or ``dropouts``), is not protected even by a secure sum: the
difference of two sums over cohorts that differ by one client is that client's value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from secagg.messages import Field, UploadSpec
from threat_models.coalition import Coalition


@dataclass(frozen=True)
class Verdict:
    """What a coalition reads of one field, and whether the layer protects it.

    Attributes:
        phase, field: which upload field.
        ok: True when the coalition learns no more than the layer promises.
        reads: what the coalition reads, e.g. ``"each upload in the clear"``,
            ``"the exact sum"``, ``"a noised sum"``.
        reason: why, in words (quoted in errors and audits).
        layer: the name of the layer that carries the field.
    """

    phase: str
    field: str
    ok: bool
    reads: str
    reason: str
    layer: str

    def __str__(self) -> str:
        mark = "protected" if self.ok else "BREAKS"
        return f"{self.phase}/{self.field} [{self.layer}]: {mark} - {self.reads}: {self.reason}"


@dataclass(frozen=True)
class _Rule:
    ok: bool
    reads: str
    reason: str
    individual_clear: bool = False  # the coalition reads single clients' values exactly


def share_threshold(desc: Mapping[str, Any], n: int | None) -> int | None:
    """T_s, the Shamir shares that rebuild one client's secrets, for a secure-sum description
    over a cohort of ``n`` (None when it depends on an unknown n)."""
    thr = desc.get("threshold", 0.7)
    if isinstance(thr, int) and not isinstance(thr, bool):
        t_count = thr
    elif n is None:
        return None
    else:
        t_count = min(max(2, math.ceil(float(thr) * n - 1e-9)), max(n, 2))
    graph = desc.get("graph", "complete")
    if graph == "complete" or n is None:
        return t_count
    from secagg.secure_sum.graph import auto_degree

    k = desc.get("k") or auto_degree(n)
    if graph == "auto" and desc.get("k") is None and k >= n - 1:
        return t_count
    k = min(int(k), n - 1)
    frac = float(thr) if isinstance(thr, float) else t_count / n
    return min(k + 1, max(2, math.ceil(frac * (k + 1) - 1e-9)))


def _secure_sum(desc: Mapping[str, Any], f: Field, th: Coalition, n: int | None) -> _Rule:
    if not f.additive:
        return _Rule(False, "nothing (refused)", "secure summation cannot carry a "
                     "non-additive field; the layer refuses it")
    if not th.has_server:
        return _Rule(True, "encrypted shares only", "without the server, clients see only "
                     "their own shares and public keys")
    if th.server == "active":
        return _Rule(False, "single uploads, unmasked", "an active server can report a live "
                     "client as dropped to some clients (getting its mask-key shares) and ask "
                     "others for its self-mask shares; this implementation has no signed "
                     "consistency round to stop that", True)
    ts = share_threshold(desc, n)
    t = th.colluding_clients
    if ts is not None and t >= ts:
        return _Rule(False, "single uploads, unmasked",
                     f"server + {t} colluding clients hold >= {ts} Shamir shares (the share "
                     "threshold) of an honest client's self-mask seed and mask key, so they "
                     "remove its masks", True)
    if n is not None and n - t <= 1:
        return _Rule(False, "the last honest client's upload",
                     f"with {t} of {n} clients colluding, the sum minus their own inputs is "
                     "the one honest client's upload", True)
    below = ("fewer than the share threshold" if ts is None
             else f"{t} < {ts} shares (the share threshold)")
    return _Rule(True, "the exact sum of the honest clients",
                 f"masked uploads only; {below}, so no client's masks can be removed")


def _homomorphic(desc: Mapping[str, Any], f: Field, th: Coalition) -> _Rule:
    if not f.additive:
        return _Rule(False, "nothing (refused)", "the server can only add ciphertexts; the "
                     "layer refuses a non-additive field")
    clients_hold = desc.get("key_holder") == "clients"
    if th.has_server and th.server == "active":
        return _Rule(False, "single uploads, decrypted", "an active server can send one "
                     "client's ciphertext for decryption as if it were the sum (the layer "
                     "has no active security)", True)
    if th.has_server and clients_hold and th.colluding_clients >= 1:
        return _Rule(False, "single uploads, decrypted", "with key_holder='clients' every "
                     "client holds the secret key; one colluding client decrypts every "
                     "ciphertext the server received", True)
    if th.has_server and th.decryptor_colludes and not clients_hold:
        return _Rule(False, "single uploads, decrypted", "the decryptor holds the secret key "
                     "and the server holds every client's ciphertext", True)
    if th.has_server or th.decryptor_colludes:
        return _Rule(True, "the exact sum", "ciphertexts under a key no coalition member "
                     "holds; only the decrypted sum")
    return _Rule(True, "nothing of other clients", "clients see only their own ciphertexts")


def _rule(desc: Mapping[str, Any], f: Field, th: Coalition, n: int | None) -> _Rule:
    name = desc.get("name", "?")
    if name == "per-group":
        routed = desc.get("routes", {}).get(f.group, desc.get("default"))
        if routed is None:
            return _Rule(False, "nothing (unrouted)", f"no layer routed for group {f.group!r}")
        return _rule(routed, f, th, n)
    if name == "plaintext":
        if th.has_server:
            return _Rule(False, "each upload in the clear", "the plaintext layer sends every "
                         "upload to the server unprotected", True)
        return _Rule(True, "nothing of other clients", "uploads go only to the server")
    if name == "secure-sum":
        return _secure_sum(desc, f, th, n)
    if name == "homomorphic":
        return _homomorphic(desc, f, th)
    inner = desc.get("inner", {})
    if name in ("central-dp", "local-dp", "distributed-dp"):
        base = _rule(inner, f, th, n)
        if f.name in desc.get("public", ()):
            return _Rule(base.ok, base.reads, f"declared public (not noised); {base.reason}",
                         base.individual_clear)
        eps = desc.get("epsilon")
        eps_txt = f"eps={eps:.3g}" if isinstance(eps, int | float) else "eps planned per run"
        if name == "local-dp":
            return _Rule(True, f"noised uploads ({eps_txt})", "each client noises its own "
                         "upload before it leaves")
        if name == "central-dp":
            if th.has_server:
                extra = (" and every upload in the clear" if base.individual_clear else "")
                return _Rule(False, "the un-noised sum" + extra, "central DP noises only what "
                             "leaves the aggregator; the curious server sees the sum before "
                             f"the noise{extra} ({base.reason})", base.individual_clear)
            return _Rule(True, f"a noised sum ({eps_txt})", "only the noised sum is released")
        # distributed-dp
        if not base.ok:
            return _Rule(False, base.reads + " carrying one noise share each",
                         base.reason + "; each unmasked upload carries only its own share of "
                         "the noise, far below the target", base.individual_clear)
        t = th.colluding_clients
        ts = share_threshold(inner, n)
        if th.has_server and ts is not None and n is not None and n - t < ts:
            return _Rule(False, "a sum with too little honest noise",
                         f"the {t} colluders subtract their own noise shares; the noise was "
                         f"sized for {ts} survivors but only {n - t} honest clients add it")
        return _Rule(True, f"a noised sum ({eps_txt})", "the honest clients' noise shares "
                     "alone meet the target; masks hide single uploads")
    return _Rule(False, "unknown", f"no threat rule for layer {name!r}: refusing to call it "
                 "safe")


def _specs_of(algorithm: Any, rounds: int = 2) -> dict[str, UploadSpec]:
    out: dict[str, UploadSpec] = {}
    for r in range(rounds):
        for ph in algorithm.phases(r, rounds):
            out.setdefault(ph.name, ph.spec())
    return out


def admissible(algorithm: Any, layer: Any, threat: Coalition | str,
               specs: Mapping[str, UploadSpec] | None = None,
               n_clients: int | None = None, *, rounds: int = 2, fraction: float = 1.0,
               dropouts: bool = False) -> list[Verdict]:
    """One :class:`Verdict` per (phase, field) of ``algorithm`` carried by ``layer``.

    Args:
        algorithm: an algorithm (after ``setup``, so its specs have shapes) or None when
            ``specs`` is given.
        layer: a layer, or its ``describe()`` dict (e.g. from a transcript header).
        threat: a :class:`~threat_models.coalition.Coalition` (e.g. a ThreatModel) or its
            CLI name (``"server+3"``).
        specs: phase name -> UploadSpec (default: the phases of rounds 0 and 1 of 2).
        n_clients: the cohort size (thresholds given as fractions need it).
        rounds: the rounds of the run (how often each phase releases).
        fraction: the share of clients sampled per round (< 1: cohorts differ between
            rounds, so round-invariant fields can be differenced).
        dropouts: clients may drop out between rounds, or a phase may be retried with
            another cohort (cohorts differ even with ``fraction=1``).
    """
    th = Coalition.parse(threat) if isinstance(threat, str) else threat
    desc = layer if isinstance(layer, Mapping) else layer.describe()
    specs = _specs_of(algorithm, max(rounds, 2)) if specs is None else specs
    risks = {}
    if algorithm is not None:
        from threat_models.differencing import plan_risks

        risks = plan_risks(algorithm, desc, th, rounds=rounds, fraction=fraction,
                           dropouts=dropouts)
    out = []
    for phase, spec in specs.items():
        for f in spec.fields:
            r = _rule(desc, f, th, n_clients)
            risk = risks.get((phase, f.name))
            if risk is not None and r.ok:
                r = _Rule(False, "each client's value, by differencing exact sums across "
                          "rounds", risk.reason)
            out.append(Verdict(phase, f.name, r.ok, r.reads, r.reason, _carrier(desc, f)))
    return out


def reads_individual(layer: Any, field: Field, threat: Coalition,
                     n_clients: int | None = None) -> bool:
    """True when ``threat`` reads single clients' values of ``field`` exactly."""
    desc = layer if isinstance(layer, Mapping) else layer.describe()
    return _rule(desc, field, threat, n_clients).individual_clear


def _carrier(desc: Mapping[str, Any], f: Field) -> str:
    if desc.get("name") == "per-group":
        routed = desc.get("routes", {}).get(f.group, desc.get("default")) or {}
        return _carrier(routed, f)
    return str(desc.get("name", "?"))
