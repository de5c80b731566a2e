"""Data sets and federated partitions.

Three data sets are known to :func:`load_dataset`:

* ``"digits"`` -- scikit-learn's 8x8 handwritten digits (bundled with scikit-learn, so it
  works offline; the embedded default). Features are scaled to [0, 1]; a fixed, stratified
  80/20 train/test split.
* ``"fashion-mnist"`` and ``"mnist"`` -- read from a directory holding the four standard IDX
  files (``train-images-idx3-ubyte.gz`` and friends, gzip-compressed or not). Fashion-MNIST
  defaults to ``/usr/share/datasets/fashion-mnist/``, where Debian's ``dataset-fashion-mnist``
  package installs it. ``SECAGG_DATA_DIR`` overrides the default; ``data_dir=`` overrides both.

A :class:`Partition` hands each simulated client its own :class:`ClientData`. The
partitioners (:func:`iid_split`, :func:`dirichlet_split`, :func:`shard_split`,
:func:`label_shards_split`) are
deterministic by seed, assign every training sample to exactly one client, give every client
at least one sample (or raise :class:`~secagg.errors.DataError`), and can carve a local test
set out of each client's own samples, stratified by label so that it follows that client's
label distribution.

Three modules, one concept each: the containers (:mod:`secagg.data.containers`), the
loaders (:mod:`secagg.data.loaders`) and the partitioners (:mod:`secagg.data.splits`);
every name is importable from :mod:`secagg.data` as before.
"""

from secagg.data.containers import ClientData, Dataset, Partition, label_skew
from secagg.data.loaders import (
    DATA_DIR_ENV,
    DATASETS,
    DEFAULT_DATA_DIRS,
    IDX_FILES,
    load_dataset,
    read_idx,
)
from secagg.data.splits import (
    SPLITS,
    _stratified_split,
    dirichlet_split,
    iid_split,
    label_shards_split,
    make_split,
    shard_split,
)

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIRS",
    "IDX_FILES",
    "SPLITS",
    "ClientData",
    "Dataset",
    "Partition",
    "dirichlet_split",
    "iid_split",
    "label_shards_split",
    "label_skew",
    "load_dataset",
    "make_split",
    "read_idx",
    "shard_split",
]

#: Former private names kept importable (tests use them).
_REEXPORTED = (_stratified_split,)
