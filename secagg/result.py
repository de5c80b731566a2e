"""What a run produced: the :class:`Result` both runtimes return, and its formatting
(``to_dict``, ``save``, the closing ``table``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from secagg.costs import DIRECTIONS, HardwareProfile, Ledger, get_profile
from secagg.transcript import Transcript


@dataclass(frozen=True)
class Evaluation:
    """An accuracy and what it measures."""

    accuracy: float
    kind: Literal["global test", "mean local test"]



@dataclass
class Result:
    """What a run produced.

    Attributes:
        accuracy: final accuracy; ``accuracy_kind`` says whether it is on the global test
            set or the mean local test accuracy (personalized algorithms).
        history: accuracy after each round.
        costs: the cost ledger (one row per message).
        transcript: what each party observed.
        privacy: the run's privacy ledger when a DP layer was used, else None.
        clips: clipped uploads per field (when clipping was asked for).
        aborted: (round, phase, reason) for phases that aborted and were skipped.
        participation: (round, phase, contributors, cohort) per phase run: how many
            sampled clients' uploads made it into the aggregate (dropouts show here; an
            aborted and skipped secure sum counts 0).
        measurements: per phase run, what the phase reported after its server step
            (:meth:`algorithms.base.Phase.measurements`, e.g. the clip bound and how many
            clients' updates were clipped), as ``{"round", "phase", **measurements}``.
        rejected: (round, phase, client, why) for every client whose upload the layer
            rejected after checking it (ValidatedSum: a proof that failed, a malformed or
            replayed share); such a client is not in the aggregate.
        client_accounts: the clients' own ledgers (embedded runs:
            :class:`~secagg.privacy.client_ledger.ClientAccounts`), reported as
            ``privacy.clients`` (:meth:`client_privacy`).
    """

    algorithm: dict[str, Any]
    layer: dict[str, Any]
    rounds: int
    seed: int
    accuracy: float
    accuracy_kind: str
    history: list[float]
    costs: Ledger
    transcript: Transcript
    privacy: Any | None = None
    clips: dict[str, int] = field(default_factory=dict)
    aborted: list[tuple[int, str, str]] = field(default_factory=list)
    participation: list[tuple[int, str, int, int]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str, int, str]] = field(default_factory=list)
    n_clients: int = 0
    wall_s: float = 0.0
    #: the signers' public keys (party -> Ed25519 public key, hex) when the run was attested
    identities: dict[str, str] | None = None
    #: the attestation scheme the signers used (:mod:`secagg.attest`), with ``identities``
    attest_scheme: str | None = None
    client_accounts: Any | None = None
    #: the trained model (:class:`secagg.model_io.TrainedModel`), when the algorithm has one
    trained: Any | None = field(default=None, repr=False)
    _clients_cache: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def client_privacy(self) -> dict[str, Any] | None:
        """Client id (a string) -> ``{"epsilon": {"release": float | None, "server": float
        | None}, "participations", "eligible_rounds", "refusals", "status"}`` at the
        run's delta (``reasons`` names why a figure is None), over each client's whole
        ledger (every run it kept); None when the run kept no client ledgers. Computed
        once."""
        if self.client_accounts is None:
            return None
        if self._clients_cache is None:
            self._clients_cache = self.client_accounts.summaries()
        return self._clients_cache

    @property
    def model(self) -> Any | None:
        """The trained model, ready for ``model(x)``: the global ``nn.Module``, or for a
        personalized algorithm a :class:`secagg.model_io.PersonalizedModels`
        (``model[client_id](x)``); None when the algorithm has no PyTorch model."""
        return None if self.trained is None else self.trained.module()

    @property
    def best_accuracy(self) -> float:
        """The highest accuracy over the rounds (see :attr:`best_round`)."""
        return max(self.history) if self.history else float("nan")

    @property
    def best_round(self) -> int:
        """The 0-based round after which :attr:`best_accuracy` was measured (the first such)."""
        return int(np.argmax(self.history)) if self.history else -1

    @property
    def planned_rounds(self) -> int:
        """The rounds the run was asked for (from the transcript header; :attr:`rounds` is
        how many ran)."""
        head = next((r for r in self.transcript.records if r.get("type") == "run"), {})
        return int(head.get("rounds", self.rounds))

    def failure(self) -> str | None:
        """Why the run did not produce a usable model, or None: every phase aborted (no
        upload was ever aggregated), or the privacy budget guard stopped it early."""
        ran = {(p[0], p[1]) for p in self.participation}
        refused = [a for a in self.aborted if (a[0], a[1]) not in ran]
        if refused and not any(p[2] for p in self.participation):
            r, phase, why = refused[0]
            return (f"the privacy budget guard refused the first release (round {r + 1}, "
                    f"phase {phase!r}): {why}; nothing was aggregated, the model is the "
                    "untrained initial one")
        if refused:
            r, phase, why = refused[0]
            return (f"stopped in round {r + 1} of {self.planned_rounds} (phase {phase!r}) by "
                    f"the privacy budget guard: {why}")
        if self.participation and all(p[2] == 0 for p in self.participation) and (
                self.client_accounts is not None and not self.aborted):
            refused = sum(int(c.get("refusals", 0))
                          for c in (self.client_privacy() or {}).values())
            return (f"no client uploaded: {refused} refusal(s) by clients over their budget "
                    "or against their policy, and no other client was drawn; the model is "
                    "the untrained initial one")
        if self.participation and all(p[2] == 0 for p in self.participation):
            return (f"every phase aborted ({len(self.aborted)} of {len(self.participation)}); "
                    "no upload was aggregated, the model is the untrained initial one")
        if self.rounds < self.planned_rounds:
            why = self.aborted[-1][2] if self.aborted else "stopped"
            return (f"stopped after {self.rounds} of {self.planned_rounds} rounds by the "
                    f"privacy budget guard: {why}")
        return None

    def to_dict(self, profile: HardwareProfile | str = "phone-wifi") -> dict[str, Any]:
        """JSON-able summary (no ledger rows or transcript records): final and best-round
        accuracy, the accuracy curve (``history``), byte totals per direction and the
        deterministic client device figures on ``profile``."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        d = {
            "algorithm": self.algorithm,
            "layer": self.layer,
            "rounds": self.rounds,
            "planned_rounds": self.planned_rounds,
            "seed": self.seed,
            "n_clients": self.n_clients,
            "accuracy": self.accuracy,
            "accuracy_kind": self.accuracy_kind,
            "best_accuracy": self.best_accuracy,
            "best_round": self.best_round,
            "history": self.history,
            "failure": self.failure(),
            "clips": self.clips,
            "aborted": self.aborted,
            "participation": self.participation,
            "measurements": self.measurements,
            "wall_s": self.wall_s,
            "costs": {d: self.costs.total(direction=d) for d in DIRECTIONS},
            "client_rounds": self.costs.client_rounds(),
            "device": {"profile": prof.name, **self.costs.estimate(prof)},
        }
        if self.rejected:  # a validating layer excluded clients
            d["rejected"] = [{"round": r, "phase": p, "client": c, "why": why}
                             for r, p, c, why in self.rejected]
        if self.privacy is not None and hasattr(self.privacy, "to_dict"):
            d["privacy"] = self.privacy.to_dict()
        clients = self.client_privacy()
        if clients is not None:
            priv = d.setdefault("privacy", {"delta": self.client_accounts.delta})
            priv["clients"] = clients
            priv["clients_delta"] = self.client_accounts.delta
        return d

    def save(self, out_dir: str | Path,
             profile: HardwareProfile | str = "phone-wifi", *,
             keys_dir: str | Path | None = None) -> dict[str, Path]:
        """Write ``result.json``, ``costs.csv`` (with the device columns for ``profile``) and
        ``transcript.jsonl`` (closed: see :meth:`secagg.transcript.Transcript.close`) into
        ``out_dir``, and for an attested run ``identities.json``, the signers' public keys
        (:mod:`secagg.attest`; what ``secagg audit --identities`` checks against), into
        ``keys_dir``: a key directory apart from the run folder (default: the folder
        ``<out_dir>.keys`` beside it). The run folder holds what the server wrote; the key
        directory is what the clients publish, so a server that rewrites its run folder
        cannot also replace the keys the audit trusts. That holds where the clients' keys
        were made by the clients themselves in this process (scheme
        :data:`secagg.attest.SCHEME`); keys the nodes announced to a remote server (Flower,
        trust on first use) are the server's word, and go in the run folder as
        ``announced_identities.json`` (path ``"announced_identities"``), which the audit
        refuses as a trust root.

        The trained model, when there is one, goes in the run folder too: ``model.pt`` and
        ``model.json`` (:mod:`secagg.model_io`).

        Raises:
            ConfigurationError: ``keys_dir`` is ``out_dir`` or inside it.
        """
        from secagg.attest import SCHEME, write_identities

        out = Path(out_dir)
        here = out.resolve()
        keys = Path(keys_dir) if keys_dir is not None else here.parent / f"{here.name}.keys"
        header = next((r for r in self.transcript.records if r.get("type") == "run"), {})
        announced = bool((header.get("attestation") or {}).get("announced"))
        # the clients' own keys, made in this process (not announced to a remote server)
        own = self.attest_scheme == SCHEME and not announced
        if self.identities and own and _inside(keys, out):
            from secagg.errors import ConfigurationError

            raise ConfigurationError(
                f"keys_dir {keys} is inside the run folder {out}: the clients' keys must be "
                "kept apart from what the server writes (choose another folder)")
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "result": out / "result.json",
            "costs": out / "costs.csv",
            "transcript": out / "transcript.jsonl",
        }
        paths["result"].write_text(
            json.dumps(self.to_dict(profile), indent=2, default=str) + "\n")
        self.costs.to_csv(paths["costs"], profile)
        self.transcript.close(self.rounds, self.failure())
        self.transcript.write(paths["transcript"])
        if self.client_accounts is not None:
            paths["client_ledgers"] = out / "client_ledgers.jsonl"
            with open(paths["client_ledgers"], "w", encoding="utf-8") as fh:
                for led in self.client_accounts.ledgers.values():
                    fh.write("".join(e.to_json() + "\n" for e in led.events))
        if self.trained is not None:
            from secagg.model_io import save_model

            paths.update(save_model(self.trained, out, {
                "algorithm": self.algorithm, "accuracy": self.accuracy,
                "accuracy_kind": self.accuracy_kind, "rounds": self.rounds,
                "seed": self.seed}))
        if self.identities and own:
            paths["identities"] = write_identities(keys / "identities.json", self.identities,
                                                   scheme=SCHEME)
        elif self.identities:
            paths["announced_identities"] = write_identities(
                out / "announced_identities.json", self.identities)
        return paths

    def what_ran(self, data: Mapping[str, Any] | None = None) -> str:
        """One line: algorithm, layer, data set, clients and split, rounds and seed
        (``data`` as for :meth:`table`; without it the data set reads "not recorded")."""
        return what_ran(self.algorithm.get("name", "?"), _layer_name(self.layer),
                        self.n_clients, self.rounds, self.seed, data)

    def _attest_rows(self, per: int) -> list[tuple[str, str]]:
        """The clients' signed statements (ledger stage ``attest``), per client per round:
        bytes (in the uplink figures above) and signing CPU."""
        rows = [r for r in self.costs.rows if r.stage == "attest"]
        if not rows:
            return []
        nbytes = sum(r.wire_bytes for r in rows)
        cpu = sum(r.client_cpu_s for r in rows)
        return [("signed statements / client / round",
                 f"{nbytes / per:,.0f} B, {1e3 * cpu / per:.3f} ms CPU (Ed25519)")]

    def table(self, profile: HardwareProfile | str = "phone-wifi",
              data: Mapping[str, Any] | None = None) -> str:
        """The closing table: what ran (algorithm, layer, data set, clients and split,
        from ``data``: ``dataset``, ``split``, ``alpha``, ``shards_per_client``, as
        ``secagg run`` passes them), final and best-round accuracy (the best round is
        picked on the same test accuracy, and the table says so), bytes per client per
        round, the client's compute (FLOPs) and its deterministic device time and energy on
        ``profile``, internal traffic, the measured host CPU seconds apart, and the privacy
        rows (``DP: none`` for a run without DP noise)."""
        prof = get_profile(profile) if isinstance(profile, str) else profile
        up, down = self.costs.total("up"), self.costs.total("down")
        internal = self.costs.total("internal")
        per = max(1, self.costs.client_rounds())  # clients only: server/decryptor never count
        est = self.costs.estimate(prof)
        rows = [
            ("ran", self.what_ran(data)),
            (f"accuracy ({self.accuracy_kind}), final", f"{self.accuracy:.4f}"),
            ("accuracy, best round (picked on test data)", f"{self.best_accuracy:.4f} after "
             f"round {self.best_round + 1} of {self.rounds}: the round whose {self.accuracy_kind}"
             " accuracy is highest, so optimistic (curve in result.json: history)"),
            ("rounds", str(self.rounds) if self.rounds == self.planned_rounds
             else f"{self.rounds} of {self.planned_rounds}"),
            ("uplink bytes / client / round", f"{up['wire_bytes'] / per:,.0f}"),
            ("downlink bytes / client / round", f"{down['wire_bytes'] / per:,.0f}"),
            ("uplink / downlink bytes, total",
             f"{int(up['wire_bytes']):,} / {int(down['wire_bytes']):,}"),
            ("internal bytes (server, decryptor), total", f"{int(internal['wire_bytes']):,}"),
            *self._attest_rows(per),
            ("client compute / client / round", f"{est['flops_per_client_round']:,.3g} FLOP"),
            (f"est. client latency / client / round ({prof.name})",
             f"{est['latency_s_per_client_round']:.3f} s "
             f"(compute {est['compute_s_per_client_round']:.3f} s)"),
            (f"est. client energy / client / round ({prof.name})",
             f"{est['energy_j_per_client_round']:.4g} J"),
            (f"est. client energy, total ({prof.name})", f"{est['energy_j']:.4g} J"),
            ("host CPU s, measured (client / server)",
             f"{up['client_cpu_s'] + down['client_cpu_s']:.2f} / "
             f"{sum(self.costs.total(d)['server_cpu_s'] for d in DIRECTIONS):.2f}"),
        ]
        if self.privacy is not None and hasattr(self.privacy, "summary_rows"):
            rows.extend(self.privacy.summary_rows())
        else:
            rows.append(("DP", "none: no noise is added, no epsilon holds against anyone"))
        rows.extend(client_rows(self.client_privacy()))
        if self.clips:
            rows.append(("clipped uploads", json.dumps(self.clips)))
        got = sum(p[2] for p in self.participation)
        asked = sum(p[3] for p in self.participation)
        if got < asked:
            rows.append(("uploads aggregated / sampled", f"{got:,} / {asked:,} "
                         f"({got / asked:.1%}; dropouts and aborted sums)"))
        if self.aborted:
            rows.append(("aborted phases", str(len(self.aborted))))
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)



def _layer_name(desc: Mapping[str, Any]) -> str:
    """A layer's name with its inner layers: ``distributed-dp(secure-sum)``."""
    inner = desc.get("inner")
    name = str(desc.get("name", "?"))
    return f"{name}({_layer_name(inner)})" if isinstance(inner, Mapping) else name


def what_ran(algorithm: str, layer: str, clients: int, rounds: int, seed: int,
             data: Mapping[str, Any] | None = None) -> str:
    """``fedlog under distributed-dp(secure-sum) on digits, 10 clients, Dirichlet split
    (alpha 0.5), 10 rounds, seed 0``: the line :meth:`Result.table` and the report print."""
    data = data or {}
    split = data.get("split")
    if split == "dirichlet":
        alpha = data.get("alpha")
        split_text = ("IID split (alpha 0)" if alpha == 0 else
                      f"Dirichlet label-skew split (alpha {alpha:g})" if alpha is not None
                      else "Dirichlet label-skew split")
    elif split == "shards":
        split_text = f"label shards ({data.get('shards_per_client', '?')} per client)"
    elif split == "iid":
        split_text = "IID split"
    else:
        split_text = "split not recorded"
    return (f"{algorithm} under {layer} on {data.get('dataset') or 'a data set not recorded'}"
            f", {clients} clients, {split_text}, {rounds} round(s), seed {seed}")


def client_spread(clients: dict[str, Any], observer: str) -> dict[str, Any] | None:
    """The distribution of the clients' epsilons against ``observer`` (from
    ``privacy.clients``): min, median, max (of the clients that have a figure), how many
    clients have no guarantee (None) and the worst clients (up to five: those with no
    guarantee, then the largest epsilons); None without any client."""
    if not clients:
        return None
    vals = [(cid, c["epsilon"].get(observer)) for cid, c in clients.items()]
    known = sorted((float(v), cid) for cid, v in vals if v is not None)
    none = [cid for cid, v in vals if v is None]
    out: dict[str, Any] = {"clients": len(vals), "no_guarantee": len(none)}
    if known:
        eps = np.array([v for v, _ in known])
        out.update(min=float(eps.min()), median=float(np.median(eps)), max=float(eps.max()))
    # the worst first: those with no guarantee, then the largest epsilons
    out["worst"] = (none + [cid for _, cid in reversed(known)])[:5]
    return out


def client_rows(clients: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Rows for the closing table: per observer, the clients' epsilon min / median / max
    and the worst clients."""
    if not clients:
        return []
    rows = []
    for obs in ("release", "server"):
        sp = client_spread(clients, obs)
        if sp is None:
            continue
        if "max" not in sp:
            rows.append((f"client epsilon vs {obs}", f"none for all {sp['clients']} clients"))
            continue
        extra = f", {sp['no_guarantee']} with none" if sp["no_guarantee"] else ""
        rows.append((f"client epsilon vs {obs} (min / median / max)",
                     f"{sp['min']:.4g} / {sp['median']:.4g} / {sp['max']:.4g}{extra}; "
                     f"worst: {', '.join(sp['worst'])}"))
    refusals = sum(int(c.get("refusals", 0)) for c in clients.values())
    if refusals:
        rows.append(("client refusals (budget or policy)", str(refusals)))
    return rows


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both resolved)."""
    p, f = path.resolve(), folder.resolve()
    return p == f or f in p.parents
