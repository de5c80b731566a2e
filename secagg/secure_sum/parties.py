"""Where a simulated session's clients run: in this process, or on several cores.

The in-process link behind :func:`~secagg.secure_sum.protocol.run_secure_sum` plays every
client of a cohort: at each stage of the driver it calls one method of each live client's
:class:`~secagg.secure_sum.client.Client` with the message the server sent it. A
:class:`Parties` makes those calls.

* :class:`Inline` calls them here, one after the other.
* :class:`Forked` spreads the clients over ``workers`` forked processes (each client lives
  in one worker for the whole session, with its keys and shares), so the clients' own work --
  key agreement, signatures, Shamir sharing, expanding and adding the masks -- runs on
  several cores, as it does on n devices. The server, the cost ledger and the transcript
  stay in this process, and outcomes come back in the order the calls were made, so a
  session's messages, ledger rows and sum are the same with any number of workers; only
  the measured CPU seconds are spread differently.

A call's argument may be :class:`Deferred`: work the client does itself, in its own
process, before the method runs (DistributedDP's noise share: this process encodes the
vector, the worker that holds the client draws the client's noise and adds it, on that
worker's CPU clock).

Calls are read lazily (the masked-input stage's arguments are the clients' vectors, each
computed when its call is read: a streamed upload is trained then), and at most one batch
per worker is in flight, so this process computes the next batch's vectors while the
workers mask the previous ones, and never holds more than ``workers x batch`` vectors.

An error a client raises on purpose while processing a message (a
:class:`~secagg.errors.ProtocolError`) is its outcome (the client is dropped at that stage);
any other exception is raised here when its call's outcome is reached, as inline.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from secagg.errors import ConfigurationError, ProtocolError, SecaggError
from secagg.secure_sum.client import Client

Call = tuple[int, Any]
"""(client, the argument of its method: a message, a vector, or None for no argument)."""

Outcome = tuple[int, bytes | None, float, str | None]
"""(client, the message it sends or None, its CPU seconds, why it failed or None)."""


class WorkerFailed(SecaggError, RuntimeError):
    """A worker process of :class:`Forked` died or could not return an outcome."""


@dataclass(frozen=True)
class Deferred:
    """A call's argument that the client's own process computes: ``fn(*args)``, run where
    the client runs (a worker of :class:`Forked`, or this process for :class:`Inline`) just
    before the client's method, and timed with it. ``fn`` is a module-level function and
    ``args`` are picklable, so the pair travels to a worker; whatever secret ``fn`` draws
    (fresh OS randomness, or a stream derived from a seed and the client's id) is drawn
    there, and the result does not depend on the process it runs in."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def __call__(self) -> Any:
        """The argument: ``fn(*args)``."""
        return self.fn(*self.args)


def call(client: Client, method: str, arg: Any) -> Outcome:
    """Run ``client.method(arg)`` (``client.method()`` when ``arg`` is None; a
    :class:`Deferred` argument is computed first), timing both on this thread's CPU clock;
    a :class:`~secagg.errors.ProtocolError` becomes the outcome's error text."""
    t0 = time.thread_time()
    try:
        if isinstance(arg, Deferred):
            arg = arg()
        fn = getattr(client, method)
        out = fn() if arg is None else fn(arg)
        err = None
    except ProtocolError as exc:
        out, err = None, str(exc)
    return client.cid, out, time.thread_time() - t0, err


class Parties(Protocol):
    """Runs a stage's calls on a session's clients (see the module docstring)."""

    def run(self, method: str, calls: Iterable[Call], batch: int = 64) -> Iterator[Outcome]:
        """Call ``method`` on each (client, argument), read lazily from ``calls``; yield the
        outcomes in the order of the calls."""
        ...

    def close(self) -> None:
        """Release whatever the parties hold (worker processes)."""
        ...


class Inline:
    """Every client in this process, one call after the other."""

    def __init__(self, clients: Mapping[int, Client]) -> None:
        self.clients = clients

    def run(self, method: str, calls: Iterable[Call], batch: int = 64) -> Iterator[Outcome]:
        """See :class:`Parties`."""
        for u, arg in calls:
            yield call(self.clients[u], method, arg)

    def close(self) -> None:
        """Nothing to release."""


def _serve(conn: Any, clients: Mapping[int, Client], inherited: list[Any]) -> None:
    """A worker's loop: (method, [(client, arg), ...]) in, the outcomes out; None (or this
    process's parent gone: end of file) ends it. ``inherited``: the parent's ends of the
    pipes, which fork copied here; closed first, so that the parent's end is the only one
    left and its death reaches this worker as end of file."""
    for other in inherited:
        other.close()
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        method, batch = req
        out: list[Any] = []
        for u, arg in batch:
            try:
                out.append(call(clients[u], method, arg))
            except BaseException as exc:  # raised in the parent, at this call's turn
                try:
                    pickle.dumps(exc)
                    out.append(("raise", u, exc))
                except Exception:
                    out.append(("raise", u, WorkerFailed(f"client {u}: {type(exc).__name__}: "
                                                         f"{exc}")))
                break
        conn.send(out)


class Forked:
    """The clients spread over ``workers`` forked processes (client i of the sorted
    cohort in worker i mod workers). Each worker inherits the clients as they are when the
    parties are made and keeps them for the session; :meth:`close` ends the workers, and so
    does this process's death (killed, it cannot close them: each worker then reads end of
    file and exits, so no client's secrets outlive the process that ran the session).

    Raises:
        ConfigurationError: ``workers`` < 2, or the platform cannot fork.
    """

    def __init__(self, clients: Mapping[int, Client], workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
            raise ConfigurationError(f"Forked needs workers >= 2, got {workers!r}")
        try:
            ctx = multiprocessing.get_context("fork")
        except ValueError as exc:
            raise ConfigurationError(f"workers > 1 need fork(): {exc}") from None
        order = sorted(clients)
        self.shard = {u: i % workers for i, u in enumerate(order)}
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for w in range(workers):
            mine = {u: clients[u] for u in order if self.shard[u] == w}
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, mine, [parent, *self.conns]),
                               daemon=True,
                               name=f"secure-sum-parties-{w}")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def _failed(self, w: int, exc: BaseException) -> WorkerFailed:
        code = self.procs[w].exitcode
        return WorkerFailed(f"secure-sum worker {w} ended (exit code {code}): "
                            f"{type(exc).__name__}")

    def _receive(self, w: int) -> list[Any]:
        try:
            return self.conns[w].recv()
        except (EOFError, OSError) as exc:
            raise self._failed(w, exc) from None

    def _send(self, w: int, req: Any) -> None:
        try:
            self.conns[w].send(req)
        except OSError as exc:
            raise self._failed(w, exc) from None

    def run(self, method: str, calls: Iterable[Call], batch: int = 64) -> Iterator[Outcome]:
        """See :class:`Parties`: batches of up to ``batch`` calls per worker, one batch in
        flight per worker."""
        workers = len(self.conns)
        pending: list[list[Call]] = [[] for _ in range(workers)]
        busy = [False] * workers
        order: deque[int] = deque()
        done: dict[int, Any] = {}

        def collect(w: int) -> None:
            for out in self._receive(w):
                done[out[1] if out[0] == "raise" else out[0]] = out
            busy[w] = False

        def send(w: int) -> None:
            if busy[w]:
                collect(w)
            self._send(w, (method, pending[w]))
            pending[w], busy[w] = [], True

        def ready() -> Iterator[Outcome]:
            while order and order[0] in done:
                out = done.pop(order.popleft())
                if out[0] == "raise":
                    raise out[2]
                yield out

        for u, arg in calls:
            w = self.shard[u]
            pending[w].append((u, arg))
            order.append(u)
            if len(pending[w]) >= batch:
                send(w)
            yield from ready()
        for w in range(workers):
            if pending[w]:
                send(w)
        for w in range(workers):
            if busy[w]:
                collect(w)
        yield from ready()
        if order:  # a worker stopped at an exception before these calls
            raise WorkerFailed(f"no outcome for clients {list(order)[:5]}")

    def close(self) -> None:
        """End the workers (they hold the session's secrets; nothing outlives it)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.conns, self.procs = [], []


def parties(clients: Mapping[int, Client], workers: int = 1) -> Inline | Forked:
    """:class:`Inline` for one worker, else :class:`Forked` over ``workers`` processes (never
    more than one per client)."""
    workers = min(int(workers), max(len(clients), 1))
    return Inline(clients) if workers <= 1 else Forked(clients, workers)
