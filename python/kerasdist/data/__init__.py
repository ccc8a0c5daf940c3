"""Input pipelines for distributed `fit`: sizing, sharding, and a shuffle that can be rebuilt.

`make_dataset` turns arrays, data frames, an existing `tf.data.Dataset` or TFRecord/CSV files into
a dataset of batches for `model.fit` under the active strategy.

By default the dataset is *one epoch*, as tf.data users expect: `model.fit(ds, epochs=N)` and a
plain `for` loop work, its cardinality is known, and each new pass over it (each new iterator that
reads it to the end) is the next epoch: pass k is epoch `initial_epoch + k`, reproducibly, like
`shuffle(reshuffle_each_iteration=True)` but the same in every process and after a restart. A pass
counts once its last batch is handed out, so one abandoned early does not (Keras peeks at a batch
under a strategy and makes a spare iterator at each epoch end). Under several replicas,
tf.distribute's iterator prefetches batches to the devices, and on an epoch of only a few
batches (4 or fewer with 2 CPU replicas, measured; `SHORT_EPOCH_STEPS`) the peek Keras takes to
build the model reads the whole first pass: `fit` then starts at epoch `initial_epoch + 1`. How
far the prefetch runs is up to tf.distribute's threads, so make_dataset warns (`ShortEpochWarning`)
instead of promising an epoch number there. resume_fit and distributed_fit never rely on the
count: they rebuild the stream of the epochs they need; so does the stream form below.

With `epochs=` (or `repeat=True`) it is instead one *stream of batches over epochs*: epoch
`initial_epoch` first, then the next ones up to `epochs` (for ever with `repeat=True`; give `fit`
the `steps_per_epoch` that `dataset_info()` reports). The order is a pure function of `(seed, epoch)`:
each epoch's permutation is `tf.random.experimental.stateless_shuffle(range(n), [seed, epoch])`
(Philox, on the CPU), computed in the graph, so it depends on nothing else (not the global seed,
not the process, not the worker). `epoch_order(n, seed, epoch)` returns the same permutation. A run resumed after `k`
batches of epoch `e` rebuilds its stream with `make_dataset(..., initial_epoch=e, skip_batches=k)`:
the batches are those the uninterrupted run would have seen next.

In-memory sources (arrays, data frames, lists and dicts of arrays) get an exact permutation per
epoch and batches that never straddle two epochs. Stream sources (files, an existing dataset) cannot
be indexed: their per-epoch order is a permutation of the files plus a permutation of the records
inside each file (or, with `cache`, a permutation inside each block of `shuffle_buffer` records),
and batches run on across epoch ends (files are read 4 at a time, so records of neighbouring
epochs also mix at the boundary), so epoch `e` of the stream means Keras epoch `e`: batches
`e * steps_per_epoch` onwards. A stream (`epochs=`, what `distributed_fit`/`resume_fit` build)
resumed with `initial_epoch`/`skip_batches` starts at the reader's position, computed without
reading (`position`): for files, from each file's record count, the files the interleave has open
at that point, each read again from its start (at most 4 files), none before them (the counts
are taken by reading each file once, then kept for its size and modification time: `counts`); for
a dataset, its pass and record there: earlier passes are not read, and the records of the pass
before the start only as the dataset's own `skip` reads them (a shuffle block is read whole). Two
cases still read and drop the batches before their start: a `cache` (filled by reading), and files
that tf.data's FILE auto-shard deals out to several workers later (without `per_worker`; with
`per_worker=True` each worker's share starts at its own position). Each pass of the one-epoch
form also reads them: pass k reaches epoch `initial_epoch + k` by reading the k epochs before it
(its epoch is known only in the graph), so k passes read about k*k/2 epochs in all. For more than
a few epochs over files or a dataset, use the stream form (`epochs=`), which reads each record
once, or `distributed_fit`/`resume_fit`, which build that stream.

Data of batches users bring (a batched `tf.data.Dataset`, a `keras.utils.PyDataset`, a Python
generator) is not make_dataset's: trainers read it as it is, one batch per step, and keep its
reader's position in each checkpoint (`resumable`; `resume_rule` says what a resume does with it).

The package, from the user's functions down: `api` (make_dataset, make_dataset_split,
plan_dataset), `plan` (the planned dataset: built, or moved to other epochs), `options` (the
options record: each argument documented and checked once), `pipelines` (the tf.data pipelines),
`info` (sizes, DatasetInfo), `order` (each epoch's permutation), `position` (where a resumed stream
starts), `sources` (what x and y hold, read once), `counts` (the files' record counts, kept);
`structure` (what a dataset users bring is, from its graph) and `resumable` (reading it, its
position kept).
"""

from kerasdist.data.api import DatasetSplit, make_dataset, make_dataset_split, plan_dataset
from kerasdist.data.info import (
    DEFAULT_BATCH_SIZE,
    BatchSizeInfo,
    DatasetInfo,
    batch_size_info,
    dataset_info,
)
from kerasdist.data.options import FILE_FORMATS, DatasetOptions
from kerasdist.data.order import epoch_order
from kerasdist.data.plan import (
    SHORT_EPOCH_STEPS,
    PlannedDataset,
    ShortEpochWarning,
    one_epoch_rebuild,
    planned_dataset,
    replace_epochs,
)
from kerasdist.data.resumable import InputWarning, resume_rule

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "FILE_FORMATS",
    "SHORT_EPOCH_STEPS",
    "BatchSizeInfo",
    "DatasetInfo",
    "DatasetOptions",
    "DatasetSplit",
    "InputWarning",
    "PlannedDataset",
    "ShortEpochWarning",
    "batch_size_info",
    "dataset_info",
    "epoch_order",
    "make_dataset",
    "make_dataset_split",
    "one_epoch_rebuild",
    "plan_dataset",
    "planned_dataset",
    "replace_epochs",
    "resume_rule",
]
