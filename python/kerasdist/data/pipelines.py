"""make_dataset's pipelines: per-epoch orders as pure functions of (seed, epoch), sharding, batching.

`training_pipeline` builds the training dataset a `PipelinePlan` describes, `validation_pipeline`
the held-out rows; everything else here is how."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from kerasdist.compat import flat_map_on_cpu, map_on_cpu
from kerasdist.data.info import BatchSizeInfo, DatasetInfo
from kerasdist.data.options import DatasetOptions
from kerasdist.data.order import epoch_order, epoch_permutation, stateless_permutation
from kerasdist.data.position import interleave_position, stream_position
from kerasdist.data.sources import Source

_MAX_EPOCH = 2**62


@dataclass(frozen=True)
class PipelinePlan:
    """What the pipelines need of a planned dataset: its options (order and transforms), its
    batches, and the epochs a pipeline reads, which start as the options' and move when a
    one-epoch pass builds its epoch's pipeline (then `initial_epoch` is a tensor)."""

    options: DatasetOptions
    sizing: BatchSizeInfo
    initial_epoch: Any
    skip_batches: int
    epochs: Any
    one_epoch: bool = False  # the finite default: one epoch per pass, the next one on each new pass
    pass_counter: Any = None  # in a one-epoch pass: the variable holding the pass's epoch

    @classmethod
    def of(cls, options: DatasetOptions, sizing: BatchSizeInfo) -> PipelinePlan:
        return cls(options, sizing, options.initial_epoch, options.skip_batches, options.epochs,
                   one_epoch=options.form == "one_epoch")

    def num_batches(self) -> int | None:
        if self.epochs is None or self.one_epoch:
            return None
        return (self.epochs - self.initial_epoch) * self.sizing.steps_per_epoch - self.skip_batches

    def epoch_range(self):
        """The epochs, as a dataset: a pipeline that reads its epochs from here serves a
        one-epoch pass without being rebuilt inside it (see _one_epoch_per_pass)."""
        import tensorflow as tf

        if self.pass_counter is not None:
            counter = self.pass_counter

            @tf.autograph.experimental.do_not_convert  # one op; autograph parsed all of this file per build
            def read_pass(_):
                return counter.read_value()

            return map_on_cpu(tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)), read_pass)
        if self.epochs is None:  # endless: infinite cardinality (a long range's overflows once unbatched);
            # not Dataset.counter, whose scan function costs every new iterator an instantiation
            return tf.data.Dataset.range(self.initial_epoch, _MAX_EPOCH).repeat()
        return tf.data.Dataset.range(self.initial_epoch, self.epochs)


def training_pipeline(source: Source, plan: PipelinePlan, info: DatasetInfo, context: Any) -> Any:
    """The training dataset for the run context: one pipeline per worker (`info.per_worker`), or
    one that tf.data shards over the workers with `info.shard_policy`."""
    if info.per_worker:
        return _per_worker(source, plan, context.strategy, info.num_samples)
    dataset = _auto_sharded(source, plan, info.num_samples, context.num_workers, info.shard_policy)
    if not plan.one_epoch:  # the one-epoch form asserts its length per pass (in _finish)
        dataset = _with_known_length(dataset, plan, context.num_workers)
    return dataset


def _finish(dataset, policy: str, counter=None, steps: int = 0, shares: int = 1):
    """Options; for a one-epoch dataset (with its `counter`) also drop the batch indices and
    count the pass done when its last batch is handed out (after the pipeline's prefetch, where
    it has one). Under DATA auto-sharding over `shares` workers each worker sees one of the last
    `shares` indices."""
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True
    policies = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = getattr(policies, policy)
    if counter is not None:
        last = max(steps - max(shares, 1), 0)

        @tf.autograph.experimental.do_not_convert  # no branch on a tensor: see _gathered_epochs
        def hand_out(index, batch):
            done = counter.assign_add(tf.cast(index >= last, tf.int64))
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(tf.identity, batch)

        dataset = map_on_cpu(dataset, hand_out)
        if shares <= 1:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    return dataset.with_options(options)


def _auto_sharded(source: Source, plan: PipelinePlan, n_train: int, workers: int, policy: str):
    """The pipeline tf.data shards over the `workers` input pipelines (RunContext.num_workers)
    with auto-shard `policy` ("FILE" or "DATA": DatasetInfo.shard_policy)."""
    batch = plan.sizing.batch_size
    if source.kind == "memory":
        build = lambda p: _memory_pipeline(source.arrays, n_train, p, batch)  # noqa: E731
    elif source.kind == "files" and plan.options.cache in (None, False):
        shares = workers if policy == "FILE" else 1
        build = lambda p: _file_pipeline(source, p, batch, shares=shares)  # noqa: E731
    else:
        build = lambda p: _stream_pipeline(source, p, batch)  # noqa: E731
    if not plan.one_epoch:
        return _finish(build(plan), policy)
    counter = _epoch_counter(plan.initial_epoch)
    dataset = _one_epoch_per_pass(build, plan, counter, source)
    return _finish(dataset, policy, counter, plan.sizing.steps_per_epoch, workers)


def _epoch_counter(start: int):
    """The epoch the next pass of a one-epoch dataset reads: a plain int64 variable on the CPU.

    Made on a thread of its own, where no strategy scope is active: inside `strategy.scope()`
    a variable would be mirrored over the replicas, and the pipeline needs one plain counter."""
    from concurrent.futures import ThreadPoolExecutor

    import tensorflow as tf

    def make():
        with tf.device("/CPU:0"):
            return tf.Variable(tf.constant(start, tf.int64), trainable=False, name="kerasdist_epoch")

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(make).result()


def _one_epoch_per_pass(build, plan: PipelinePlan, counter, source: Source):
    """Each pass (each new iterator) is one whole epoch: the one the counter holds. Batches carry
    their index in the pass, so `_finish` can advance the counter once the last one is handed
    out, after the prefetch: a pass abandoned early (Keras peeks at one batch to build the model
    under a strategy, and makes a spare iterator at each epoch end) does not count as an epoch.

    In-memory pipelines read their epoch from `plan.epoch_range()`, so they read the counter
    there. Others count their stream from `plan.initial_epoch` in Python, so each pass builds
    its pipeline anew inside a flat_map, which makes a new iterator cost several times more."""
    import tensorflow as tf

    if source.kind == "memory":
        return build(replace(plan, one_epoch=False, epochs=None, pass_counter=counter)).enumerate()

    def one_pass(_):
        epoch = counter.read_value()
        return build(replace(plan, initial_epoch=epoch, epochs=epoch + 1, one_epoch=False)).enumerate()

    return flat_map_on_cpu(tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)), one_pass)


def _with_known_length(dataset, plan: PipelinePlan, workers: int):
    """Tell tf.data how many batches a finite pipeline has (its flat_map, or its unbatch after a
    reshape, hides it). Keras then ends each pass cleanly instead of warning "Your input ran out
    of data" after every evaluation, and counts its steps right. Only where no worker's share is cut out of the
    pipeline later (one worker): a sharded share would trip the assertion."""
    import tensorflow as tf

    total = plan.num_batches()
    if total is None or workers > 1:
        return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(total))


# In-memory data up to this size is gathered one epoch at a time (one copy of the data per epoch
# in flight), which leaves the pipeline one slice per batch; larger data is gathered per batch.
_WHOLE_EPOCH_BYTES = 64 * 2**20


def _memory_pipeline(arrays, n, plan: PipelinePlan, batch, share=(0, 1)):
    """Per epoch: the epoch's permutation (or range) and this pipeline's share of it; then data up
    to _WHOLE_EPOCH_BYTES is gathered whole and cut into batches (`_gathered_epochs`), larger data
    (or data with a map_fn) is batched and gathered batch by batch."""
    import tensorflow as tf

    tensors = tf.nest.map_structure(tf.constant, arrays)
    drop = plan.sizing.drop_remainder
    whole_epochs_fit = sum(getattr(a, "nbytes", _WHOLE_EPOCH_BYTES + 1) for a in tf.nest.flatten(arrays)) \
        <= _WHOLE_EPOCH_BYTES
    if plan.options.map_fn is None and whole_epochs_fit:
        return _gathered_epochs(tensors, n, plan, batch, share)

    @tf.autograph.experimental.do_not_convert  # no branch on a tensor: see _gathered_epochs
    def gather(indices):
        return tf.nest.map_structure(lambda t: tf.gather(t, indices), tensors)

    def epoch(ep):
        mine = _epoch_indices(n, plan, ep, share, batch)
        if plan.options.map_fn is None:  # whole batches of indices sliced out, not batched element by element
            return _index_batches(mine, batch, drop).map(
                gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        ds = map_on_cpu(tf.data.Dataset.from_tensor_slices(mine), gather)
        ds = ds.map(plan.options.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.batch(batch, drop_remainder=drop)

    return flat_map_on_cpu(plan.epoch_range(), epoch).prefetch(tf.data.AUTOTUNE)


# The pipeline functions are instantiated again for every new iterator (Keras makes one per fit
# call, and one or two per epoch of a one-epoch dataset), so they are built with compat.map_on_cpu
# (no Grappler pass) and what Python knows is decided in Python, not put in the graph.
# Why: see bench/README.md, "Input pipeline".
def _epoch_indices(n, plan: PipelinePlan, ep, share, batch):
    """Epoch `ep`'s order (or range), this pipeline's share of it, less the whole batches the
    first epoch skips."""
    import tensorflow as tf

    index, count = share
    order = epoch_permutation(n, plan.options.seed, ep) if plan.options.shuffle else tf.range(n, dtype=tf.int64)
    mine = order[index::count] if count > 1 else order
    if not plan.skip_batches:
        return mine
    first = tf.equal(ep, plan.initial_epoch)
    return mine[tf.where(first, tf.constant(plan.skip_batches * batch, tf.int64), 0):]


def _gathered_epochs(tensors, n, plan: PipelinePlan, batch: int, share):
    """Each epoch gathered at once, one epoch ahead (the next one is ready on another thread when
    this one ends), and cut into whole batches by a reshape: handing out a batch is then one
    slice, with no function of ours per batch. Without a last, short batch the batches keep
    their static shape [batch, ...]: Keras then traces its step for that shape, about 4% faster
    than one traced for [None, ...] in a side-by-side check on the bench's tiny model (2 CPUs)."""
    import tensorflow as tf

    index, count = share
    remainder = len(range(index, n, count)) % batch  # every epoch's: skipping takes whole batches
    tail = remainder > 0 and not plan.sizing.drop_remainder
    in_order = not plan.options.shuffle and not plan.skip_batches and count == 1
    if in_order and any(t.shape[0] != n for t in tf.nest.flatten(tensors)):  # validation rows follow
        tensors = tf.nest.map_structure(lambda t: t[:n], tensors)

    def whole_batches(t):
        return tf.reshape(t[:-remainder] if remainder else t, [-1, batch, *t.shape[1:]])

    # Nothing here (nor in the pipeline's other functions of ours so marked, which call no user
    # code) branches on a tensor, so AutoGraph is not needed: converting this one and what it
    # calls cost about 4 s of CPU in each new process (in each distributed_fit's first).
    @tf.autograph.experimental.do_not_convert
    def epoch_batches(ep):
        if in_order:
            epoch = tensors
        else:
            order = _epoch_indices(n, plan, ep, share, batch)
            epoch = tf.nest.map_structure(lambda t: tf.gather(t, order), tensors)
        whole = tf.nest.map_structure(whole_batches, epoch)
        return (whole, tf.nest.map_structure(lambda t: t[-remainder:], epoch)) if tail else whole

    @tf.autograph.experimental.do_not_convert
    def whole_then_short(whole, rest):
        return tf.data.Dataset.from_tensor_slices(whole).concatenate(tf.data.Dataset.from_tensors(rest))

    epochs = map_on_cpu(plan.epoch_range(), epoch_batches).prefetch(1)
    batches = flat_map_on_cpu(epochs, whole_then_short) if tail else epochs.unbatch()
    # No prefetch after the batches: handing out a slice is cheaper than a hand-off between
    # threads (a graph loop read a batch in 29 us without one, 41 us with one). Nothing here runs
    # in parallel, so there is nothing for tf.data's autotuning to tune either; left on, it would
    # give every new iterator a performance model and a thread.
    untuned = tf.data.Options()
    untuned.autotune.enabled = False
    return batches.with_options(untuned)


def _index_batches(indices, batch: int, drop: bool):
    """`from_tensor_slices(indices).batch(batch, drop)`, with each batch sliced out in one op
    instead of gathered element by element by tf.data."""
    import tensorflow as tf

    size = tf.shape(indices, out_type=tf.int64)[0]
    count = size // batch if drop else (size + batch - 1) // batch

    @tf.autograph.experimental.do_not_convert  # no branch on a tensor: see _gathered_epochs
    def one(i):
        part = indices[i * batch: tf.minimum((i + 1) * batch, size)]
        return tf.ensure_shape(part, [batch]) if drop else part

    return map_on_cpu(tf.data.Dataset.range(count), one)


def _file_pipeline(source: Source, plan: PipelinePlan, batch, share=None, shares: int = 1):
    """Files permuted per epoch, records permuted inside each file; FILE auto-shard finds the
    file-name stream (range -> map -> unbatch) in front of the reader and shards it.

    `shares`: how many workers the file names will be dealt out to (by FILE auto-shard, or by
    `share`). The reader interleaves no more files than one worker gets per epoch, so with
    files of equal length a worker's epoch holds exactly its files' records, not some of the
    next epoch's.

    A stream that starts after its first batch starts at the reader's position there, computed
    from the files' record counts (`position.interleave_position`): only the files open at that
    point are read again, from their start. Not where FILE auto-shard deals the names out later
    (several workers without per_worker), nor in a one-epoch pass (its epoch is known only in the
    graph): those read and drop the batches before their start."""
    import tensorflow as tf

    files = tf.constant(list(source.files))
    counts = tf.constant(list(source.counts), tf.int64)
    n_files = len(source.files)
    seed, shuffle = plan.options.seed, plan.options.shuffle

    def epoch_files(ep):
        idx = epoch_permutation(n_files, seed, ep) if shuffle else tf.range(n_files, dtype=tf.int64)
        return tf.gather(files, idx), tf.fill([n_files], ep), idx, tf.gather(counts, idx)

    def read(path, ep, file_id, count, skip=None):
        records = source.reader(path)
        if shuffle:
            block = records.batch(tf.maximum(count, 1))  # the whole file

            def permute(*element):  # tf.data spreads a tuple element over the arguments
                element = element[0] if len(element) == 1 else element
                size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
                file_seed = tf.random.experimental.stateless_fold_in(
                    tf.stack([tf.cast(seed, tf.int64), ep]), file_id)
                order = stateless_permutation(size, file_seed)
                return tf.nest.map_structure(lambda t: tf.gather(t, order), element)

            records = map_on_cpu(block, permute).unbatch()
        return records if skip is None else records.skip(skip)

    def names_from(first):  # the stream of file names from name number `first` on
        epochs = map_on_cpu(tf.data.Dataset.range(first // n_files, _MAX_EPOCH), epoch_files).unbatch()
        return epochs.skip(first % n_files) if first % n_files else epochs

    shard_names = share is not None and share[1] > 1 and n_files >= share[1]
    if shard_names:
        shares = share[1]
    cycle = max(1, min(n_files // shares, 4))
    record_share = share if share is not None and share[1] > 1 and not shard_names else (0, 1)
    start = _start_batch(plan)
    if not isinstance(start, int) or not start or (share is None and shares > 1):
        # A long range, not Dataset.counter(): its (overflowing) cardinality is hidden by the
        # interleave below, and a known one would make sharded file pipelines claim a length.
        names, start_at = names_from(0), start
        if shard_names:
            names = names.shard(share[1], share[0])
    else:
        names_share = share if shard_names else (0, 1)
        names = _names_at(source, plan, names_from, names_share, cycle, start * batch * record_share[1])
        start_at = 0
    records = names.interleave(
        read, cycle_length=cycle, block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )
    if record_share[1] > 1:
        records = records.shard(record_share[1], record_share[0])
    return _batch_stream(records, plan, batch, start_at)


def _names_at(source: Source, plan: PipelinePlan, names_from, share, cycle: int, records: int):
    """The file names a resumed interleave reads, with the records each skips: the files open
    after `records` records of this pipeline's stream (before a record share), then the rest."""
    import tensorflow as tf

    index, count = share
    n_files = len(source.files)
    orders: dict[int, Any] = {}

    def file_of(name: int) -> tuple[int, int]:  # name number in this share -> (epoch, file)
        ep, place = divmod(name * count + index, n_files)
        if ep not in orders:
            orders[ep] = epoch_order(n_files, plan.options.seed, ep) if plan.options.shuffle else range(n_files)
        return ep, int(orders[ep][place])

    position = interleave_position(lambda name: source.counts[file_of(name)[1]], cycle, records)
    opened = [(*file_of(name), read) for name, read in position.open_files]
    head = tf.data.Dataset.from_tensor_slices((
        tf.constant([source.files[f] for _, f, _ in opened]),
        tf.constant([ep for ep, _, _ in opened], tf.int64),
        tf.constant([f for _, f, _ in opened], tf.int64),
        tf.constant([source.counts[f] for _, f, _ in opened], tf.int64),
        tf.constant([read for _, _, read in opened], tf.int64),
    ))
    rest = names_from(position.next_name * count)
    if count > 1:
        rest = rest.shard(count, index)
    unread = tf.constant(0, tf.int64)

    @tf.autograph.experimental.do_not_convert  # no control flow; autograph parses the whole file for a lambda
    def with_unread(path, ep, file_id, n):
        return path, ep, file_id, n, unread

    return head.concatenate(map_on_cpu(rest, with_unread))


def _stream_pipeline(source: Source, plan: PipelinePlan, batch, share=None):
    """An existing dataset, or cached file records: blocks of shuffle_buffer records, each
    permuted with a seed folded from (seed, block number) along the repeated stream.

    A stream that starts after its first batch starts at its record in the source's pass
    (`position.stream_position`): the passes before are not read, and the records of the pass
    before the start only as the source reads them to skip them (its own `skip`; a block being
    permuted is read whole). With a cache, that first pass is read whole, as it fills the cache
    the later passes read."""
    import tensorflow as tf

    if source.kind == "files":
        records = tf.data.Dataset.from_tensor_slices(list(source.files)).interleave(
            source.reader, cycle_length=1
        )
    else:
        records = source.dataset
    cached = plan.options.cache not in (None, False)
    if cached:
        records = records.cache("" if plan.options.cache in (True, "memory") else os.fspath(plan.options.cache))
    n_mine = source.n
    if share is not None and share[1] > 1:
        records = records.shard(share[1], share[0])
        n_mine = len(range(share[0], source.n, share[1]))
    start = _start_batch(plan)
    at = None if not isinstance(start, int) or not start else stream_position(n_mine, start * batch)
    buffer = plan.options.shuffle_buffer
    if plan.options.shuffle:
        first_block = 0 if at is None else at.within // buffer
        blocks = records.batch(buffer).repeat()
        if at is not None and first_block:
            blocks = records.skip(first_block * buffer).batch(buffer).concatenate(blocks)
        blocks_per_pass = -(-n_mine // buffer)
        numbered_from = 0 if at is None else at.epochs * blocks_per_pass + first_block
        numbered = tf.data.Dataset.zip((tf.data.Dataset.counter(numbered_from), blocks))

        def permute(number, element):
            size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant([plan.options.seed, 0], tf.int64), number
            )
            order = stateless_permutation(size, seed)
            return tf.nest.map_structure(lambda t: tf.gather(t, order), element)

        records = map_on_cpu(numbered, permute).unbatch()
        if at is not None and at.within % buffer:
            records = records.skip(at.within % buffer)
    elif at is not None and at.within:
        records = records.skip(at.within).concatenate(records.repeat())
    else:
        records = records.repeat()
    return _batch_stream(records, plan, batch, start if at is None else 0)


def _start_batch(plan: PipelinePlan):
    """The batch a stream source's pipeline starts at (a tensor in a one-epoch pass): epoch e
    starts at batch e * steps_per_epoch."""
    return plan.initial_epoch * plan.sizing.steps_per_epoch + plan.skip_batches


def _batch_stream(records, plan: PipelinePlan, batch, skip):
    """A continuous record stream -> batches, less the first `skip` (those not skipped already)."""
    import tensorflow as tf

    if plan.options.map_fn is not None:
        records = records.map(plan.options.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = records.batch(batch, drop_remainder=True)
    if not isinstance(skip, int) or skip:  # a tensor in a one-epoch pass
        batches = batches.skip(skip)
    total = plan.num_batches()
    return (batches if total is None else batches.take(total)).prefetch(tf.data.AUTOTUNE)


def _per_worker(source: Source, plan: PipelinePlan, strategy: Any, n_train: int):
    """One pipeline per worker: its share of each epoch's order, batched per replica."""
    import tensorflow as tf

    global_batch = plan.sizing.batch_size

    def dataset_fn(context: tf.distribute.InputContext):
        per_replica = context.get_per_replica_batch_size(global_batch)
        share = (context.input_pipeline_id, context.num_input_pipelines)
        # A global step takes one per-replica batch from each replica; this pipeline feeds
        # replicas_in_sync / num_input_pipelines of them, so skipping k steps skips k such groups.
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        worker_plan = replace(plan, skip_batches=plan.skip_batches * replicas_here)
        if source.kind == "memory":
            build = lambda p: _memory_pipeline(source.arrays, n_train, p, per_replica, share)  # noqa: E731
        elif source.kind == "files" and plan.options.cache in (None, False):
            build = lambda p: _file_pipeline(source, _stream_plan(p, replicas_here), per_replica, share)  # noqa: E731
        else:
            build = lambda p: _stream_pipeline(source, _stream_plan(p, replicas_here), per_replica, share)  # noqa: E731
        if not plan.one_epoch:
            return _finish(build(worker_plan), "OFF")
        steps = plan.sizing.steps_per_epoch * replicas_here
        if source.kind == "memory":  # this pipeline's share of the samples, in per-replica batches
            mine = len(range(share[0], n_train, share[1]))
            steps = mine // per_replica if plan.sizing.drop_remainder else -(-mine // per_replica)
        return _finish(_one_epoch_per_pass(build, worker_plan, counter, source), "OFF", counter, steps)

    counter = _epoch_counter(plan.initial_epoch) if plan.one_epoch else None
    return strategy.distribute_datasets_from_function(dataset_fn)


def _stream_plan(plan: PipelinePlan, replicas_here: int) -> PipelinePlan:
    """Stream sources count epochs in batches: a worker's epoch is replicas_here times as many."""
    sizing = replace(plan.sizing, steps_per_epoch=plan.sizing.steps_per_epoch * replicas_here)
    return replace(plan, sizing=sizing)


def validation_pipeline(source: Source, sizing: BatchSizeInfo, n_train: int, drop_remainder: bool):
    """The rows after the first `n_train` (validation_split's), in order, batched once."""
    import tensorflow as tf

    tail = tf.nest.map_structure(lambda a: a[n_train:], source.arrays)
    ds = tf.data.Dataset.from_tensor_slices(tail).batch(sizing.batch_size, drop_remainder=drop_remainder)
    return _finish(ds.prefetch(tf.data.AUTOTUNE), "DATA")
