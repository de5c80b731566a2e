"""Privacy-utility sweeps: a grid of federated runs, resumable, in parallel, with a cache.

A sweep is a grid over algorithms x layers x epsilon x delta x clipping bound x dropout x
seeds, read from a TOML file (:func:`load_config`, keys documented in :data:`KEYS` and in
``examples/sweep.toml``) or given as a dict to :func:`sweep`. Every cell is one
:class:`~secagg.federation.Federation` run; cells run in worker processes (``spawn``
context, by default one worker per core this process may use,
:func:`~secagg.cores.available_cores`) and each finished cell is appended, with
flush and fsync, to ``results.jsonl`` and ``results.csv`` in the output directory, keyed by
a stable cell id (a hash of everything that determines the cell's result). Rerunning the
same sweep skips the cells already recorded, so an interrupted sweep loses only the cells
that were running.

Which releases are noised. By default every phase of every round goes through the cell's
DP layer. ``dp_phases`` (phase names) and ``dp_rounds`` (``"all"`` or ``"last"``) restrict
the DP layer to some releases -- e.g. SphereFed's ``"ffc"`` calibration on a body trained
without DP, or FedLog's last-round head. The other releases then go through the DP
layer's inner layer (Plaintext or SecureSum) *without noise*; the run's privacy ledger is
marked not private with that reason, and the epsilon reported covers the noised releases
only. Nothing is called private that is not.

The statistics cache. When an upload does not depend on the noise of earlier releases
(one-shot statistics: a Gram/ridge solve, CCVR's moments or SphereFed's FFC on a fixed
body, a FedLog head on fixed bodies), the clients' statistics are the same in every cell
that differs only in the DP layer, epsilon or delta. The sweep then runs one *recording*
cell per group (same algorithm, data, seed, dropout, clip and inner layer), which stores
what the non-noised releases gave the server and the clients' uploads of the noised ones;
every other cell of the group *replays* them and only re-noises. Replay is checked, not
assumed: before each client step the broadcast is compared (SHA-256) with the recorded
one, and the first difference -- an upload that does depend on earlier noise -- abandons
the replay and runs the cell for real. The ``cache`` column says ``record``, ``hit``,
``miss`` (fell back) or ``off``. With the same (seeded) noise a cached cell equals the
uncached one exactly (tests/test_sweep.py).

Per-client epsilons. When a run reports each client's own epsilon (``result.json``'s
``privacy.clients``), its row records the spread per observer (min / median / max and
how many clients have no figure: :func:`~secagg.sweep.report.client_spread`) and, in
``results.jsonl``, every client's figure for the histogram ``secagg plot`` draws. A cell
records no figure against the server under central DP, and none at all when its run is
not private, whatever the run reports.

Modules: :mod:`~secagg.sweep.config` (keys, validation, the grid),
:mod:`~secagg.sweep.cache` (the staged layer, recording and replay),
:mod:`~secagg.sweep.cells` (one cell), :mod:`~secagg.sweep.schedule` (the pool, resuming)
and :mod:`~secagg.sweep.report` (results files).
"""

from __future__ import annotations

from secagg.sweep.cells import _algorithm as _algorithm
from secagg.sweep.cells import _layers as _layers
from secagg.sweep.cells import _partition as _partition
from secagg.sweep.cells import run_cell
from secagg.sweep.config import CLIP_ARGUMENT as CLIP_ARGUMENT
from secagg.sweep.config import DP_LAYERS as DP_LAYERS
from secagg.sweep.config import KEYS, Cell, SweepConfig, load_config
from secagg.sweep.config import PLAIN_LAYERS as PLAIN_LAYERS
from secagg.sweep.report import CSV_COLUMNS as CSV_COLUMNS
from secagg.sweep.report import SweepResult
from secagg.sweep.schedule import sweep

# The names in __all__ are the public API; the others (constants and the per-cell helpers
# the tests and benchmarks use) stay importable from here, as before the module was split.
__all__ = ["KEYS", "Cell", "SweepConfig", "SweepResult", "load_config", "sweep", "run_cell"]
