"""The data users bring, continued at the next unseen batch after a restart: a batched
`tf.data.Dataset` (the Keras guide's `shuffle -> batch -> cache -> prefetch`, Keras's
`image_dataset_from_directory` and friends), a `keras.utils.PyDataset`, a Python generator.

kerasdist reads such data itself, one batch per step, through one reader over its repeated
passes (`ResumableInput.next_batch`: Keras's fit takes it through `compat.keras_stream`), so the
reader's position at a step end is exactly that of the batches trained. Each checkpoint keeps that
position (`ResumableInput.state`), and a restarted run puts a new reader there before its first
batch. What is kept, by kind of data (`resume_rule` says it for given data):

- a `tf.data.Dataset` without a shuffle: the iterator's state where it is (positions only where
  every op allows a symbolic checkpoint, `data/structure.py`'s `DIRECT_OPS`, else with the
  elements its ops hold: a prefetch buffer, a cache being filled). Nothing is read again on
  resume.
- a tf.data pipeline with a shuffle (the Keras guide's `shuffle -> batch`, Keras's
  `image_dataset_from_directory`, files through an interleave, `cache()`, two shuffles, ...),
  read without symbolic checkpoints (which save a shuffle's buffer all the same, and whose
  shuffle costs time in proportion to its buffer on every element): the iterator's state
  where it is when that state holds every shuffle's random state, else its last state that did
  (a pass's start, or at worst the run's first iterator) and the batches read since, which a
  resume reads again and discards. A shuffle's seed generator, which draws each pass's
  reshuffle, is in TensorFlow 2.21's state only while the shuffle has a live iterator; an
  interleave or a second shuffle drops it once its input is exhausted, near a pass's end (and,
  as tf.data reads ahead, at a pass's start), and such a state restores the next pass's order
  wrongly (the family of tensorflow#48178; compat/tf_data_state.py).
- a dataset with ops whose state lives outside tf.data (a stateful random op, a `py_function`):
  as above, without that state: their values after a resume differ.
- a dataset that reads a Python generator (`from_generator`), or a Python generator: nothing can
  be saved; a resume starts the generator again and discards the batches the interrupted epoch
  had trained (exact for a generator that yields the same batches each time it starts).
- a `keras.utils.PyDataset`: its batch index; a resume calls its `on_epoch_begin` and
  `on_epoch_end` for the epochs before (so an order its hooks change per epoch is the same), then
  reads from the index.

Under several replicas each global batch is split over them, rows in order (sizes differing by at
most one, the larger first, as tf.distribute's rebatch); under several workers every worker reads
the whole pipeline and keeps its replicas' rows (tf.distribute's DATA sharding), so every worker's
reader is at the same position and the chief's state resumes them all, whatever their number.
"""

from __future__ import annotations

import collections.abc
import struct
import warnings
from typing import Any

import tensorflow as tf

from kerasdist import compat
from kerasdist.data.structure import DatasetStructure, dataset_structure
from kerasdist.validation import optional_integer


class InputWarning(UserWarning):
    """What a resume will do with data kerasdist cannot continue exactly (said once, at the start)."""


class ResumableInput:
    """Data a trainer reads one global batch per step, its position kept in checkpoints.

    Attributes:
        steps_per_epoch: batches per epoch (None until known: `count_steps`).
        global_batch_size: samples per batch when the data says, else None.
        rule: how a resume continues it (one of `RULES`' keys).
        element_spec: the structure of a batch, as tf.data describes it (None when unknown).
    """

    steps_per_epoch: int | None = None
    global_batch_size: int | None = None
    rule: str = "replayed"
    element_spec: Any = None

    def start(self, context: Any, state: bytes | None, epoch: int, skip: int) -> None:
        """Read from the point a resume continues at: `state` (what `state()` returned when the
        checkpoint was taken), or, without one, `skip` batches into `epoch`."""
        raise NotImplementedError

    def state(self) -> bytes | None:
        """The position of the next batch, for a checkpoint (None: nothing kept)."""
        return None

    def next_batch(self) -> Any:
        """The next global batch, split over the replicas (see the module's docstring)."""
        return self._distributed(self._next())

    def _next(self) -> Any:
        raise NotImplementedError

    def keras_input(self) -> Any:
        """What Keras's fit takes as `x` (with `steps_per_epoch`) to train on this data."""
        return compat.keras_stream(self.next_batch, self.element_spec)

    def _distributed(self, batch: Any) -> Any:
        context = self._context
        if context is None or context.num_replicas == 1:
            return batch
        bounds = replica_rows(_rows(batch), context.num_replicas)

        def replica_value(value_context: Any) -> Any:
            begin, end = bounds[value_context.replica_id_in_sync_group]
            return tf.nest.map_structure(lambda t: _slice(t, begin, end), batch)

        return context.strategy.experimental_distribute_values_from_function(replica_value)

    _context: Any = None


RULES = {
    "positions": "continues at the next unseen batch; the checkpoint keeps the reader's position "
                 "where it is (a symbolic tf.data checkpoint), nothing is read again",
    "elements": "continues at the next unseen batch; the checkpoint keeps the reader's position where "
                "it is, with the elements its ops hold (a prefetch buffer, a cache being filled)",
    "pass start": "continues at the next unseen batch; the checkpoint keeps the reader's position where "
                  "it is when TensorFlow's state of it holds every shuffle's random state, else at the "
                  "last batch it did (TensorFlow restores the others wrongly, tensorflow#48178), and a "
                  "resume reads the batches trained since again",
    "without external state": "continues at the next unseen batch (from a pass's start, its "
                              "batches since read again), but the state of {external} (outside "
                              "tf.data) is not saved: their values after a resume differ",
    "replayed": "cannot be saved: a resume starts it again and discards the batches the "
                "interrupted epoch trained (exact only if it yields the same batches each time)",
    "index": "continues at the next batch index; its on_epoch_begin/on_epoch_end are called for "
             "the epochs before",
}
# How to make data with each inexact rule resume exactly.
_EXACT_HINTS = {
    "without external state": "use stateless ops (tf.random.stateless_*, or keras.random with a "
                              "SeedGenerator in a layer of the model) instead",
    "replayed": "build it with tf.data (from_tensor_slices, file readers, map) or a "
                "keras.utils.PyDataset instead",
}


class DatasetInput(ResumableInput):
    """A batched `tf.data.Dataset`, read through one iterator over its repeated passes."""

    def __init__(self, dataset: tf.data.Dataset, structure: DatasetStructure | None = None,
                 steps_per_epoch: int | None = None):
        self.dataset = dataset
        self.structure = structure or dataset_structure(dataset)
        self.rule = {"nothing": "replayed"}.get(self.structure.saved, self.structure.saved)
        # "pass start" and "without external state": the last state that restores right (None: the
        # run's first iterator, before any batch), the batches pulled since (over passes too) and
        # the batches of its pass before it; whether a whole pass was counted before that iterator
        # (which drew from the shuffles' seed generators: a replay from there counts one too)
        self._anchor: bytes | None = None
        self._since_anchor = self._anchor_into_pass = 0
        self._counted_first = False
        self._into_pass = 0  # batches pulled since the pass began
        self._offered = False  # the iterator's current state was offered as the anchor
        self.global_batch_size = self.structure.batch_size
        self.element_spec = dataset.element_spec
        count = int(dataset.cardinality())
        if count == 0:
            raise ValueError("data is an empty tf.data.Dataset: it has no batch to train on.")
        self.steps_per_epoch = steps_per_epoch or (count if count > 0 else None)
        self.counted = False  # steps_per_epoch taken from a pass over the data (or a checkpoint that did)
        self._iterator: Any = None

    def count_steps(self, recorded: int | None = None) -> int:
        """Batches per epoch: given, known to tf.data, `recorded` by a checkpoint, or counted by
        a read of one whole pass (recorded in checkpoints from then on)."""
        if self.steps_per_epoch is None:
            self.counted = True
            self.steps_per_epoch = recorded or self._count_pass()
            if self.steps_per_epoch == 0:
                raise ValueError("data is an empty tf.data.Dataset: it has no batch to train on.")
        return self.steps_per_epoch

    def _count_pass(self) -> int:
        self._counted_first = self._iterator is None
        return int(self.dataset.reduce(tf.constant(0, tf.int64), lambda count, *_: count + 1))

    def start(self, context: Any, state: bytes | None, epoch: int, skip: int) -> None:
        self._context = context
        if state is None or self.rule == "replayed":
            if skip and self.rule != "replayed":
                _warn_no_position(epoch, skip)
            self._open()
        else:
            position, skip, into_pass, counted_first = _decoded(state)
            if position is None and counted_first and not self._counted_first:
                self._count_pass()  # as the run did before its first iterator: the same seeds drawn
            self._open()
            self._counted_first = counted_first
            if position is not None:
                self._restore(position)
            self._anchor, self._anchor_into_pass, self._into_pass = position, into_pass, into_pass
        for _ in range(skip):
            self._next()

    def _open(self) -> None:
        options = tf.data.Options()
        options.experimental_symbolic_checkpoint = self.rule == "positions"
        self._iterator = iter(self.dataset.with_options(options).repeat())

    def _restore(self, position: bytes) -> None:
        try:
            compat.restore_iterator_state(self._iterator, position)
        except (tf.errors.OpError, ValueError) as error:
            raise ValueError(
                "data: the checkpoint's input position does not fit this dataset (is it the same "
                f"pipeline, with the same ops in the same order?): {_first_line(error)}"
            ) from None
        self._offered = True

    def state(self) -> bytes | None:
        if self.rule == "replayed" or self._iterator is None:
            return None
        if self.rule in ("positions", "elements"):
            return _encoded(self._position(), 0, 0, False)
        self._begin_pass_if_ended()
        if not self._anchors_at_pass_starts():
            self._offer_anchor()
        return _encoded(self._anchor, self._since_anchor, self._anchor_into_pass, self._counted_first)

    def _anchors_at_pass_starts(self) -> bool:
        """Whether anchors are taken only at a pass's start (and at each one, as a checkpoint may
        come any time): for ops outside tf.data, or shuffles whose states cannot be checked.
        Otherwise a checkpoint offers its state, and a pass's start costs no extra state (which
        holds a shuffle's whole buffer)."""
        return self.rule == "without external state" or self.structure.shuffles is None

    def _begin_pass_if_ended(self) -> None:
        if self._into_pass >= self.steps_per_epoch:
            self._into_pass = 0
        if self._into_pass == 0 and self._anchors_at_pass_starts():
            self._offer_anchor()

    def _offer_anchor(self) -> None:
        """Keep the iterator's state as the anchor when it restores right: it holds every shuffle's
        random state (compat.shuffle_counts_kept; near a pass's end, or a pipeline's very start,
        TensorFlow's state may not), else the anchor kept stays."""
        if self._offered:
            return
        self._offered = True
        position = self._position()
        shuffles = self.structure.shuffles
        if shuffles is None or compat.shuffle_counts_kept(position) >= shuffles:
            self._anchor, self._since_anchor, self._anchor_into_pass = position, 0, self._into_pass

    def _position(self) -> bytes:
        return compat.iterator_state(self._iterator, ignore_external_state=self.rule == "without external state")

    def _next(self) -> Any:
        self._begin_pass_if_ended()
        self._into_pass += 1
        self._since_anchor += 1
        self._offered = False
        return self._iterator.get_next()


class PyDatasetInput(ResumableInput):
    """A `keras.utils.PyDataset` (batches by index), read in order, its epoch hooks called."""

    rule = "index"

    def __init__(self, data: Any, steps_per_epoch: int | None = None):
        self.data = data
        count = getattr(data, "num_batches", None)
        self.steps_per_epoch = steps_per_epoch or count
        if self.steps_per_epoch is None:
            raise ValueError("data is a PyDataset without a length (num_batches None): pass steps_per_epoch.")
        self._epoch = self._index = 0

    def start(self, context: Any, state: bytes | None, epoch: int, skip: int) -> None:
        self._context = context
        for _ in range(epoch):
            self.data.on_epoch_begin()
            self.data.on_epoch_end()
        self._epoch, self._index = epoch, skip
        self.data.on_epoch_begin()

    def _next(self) -> Any:
        if self._index == self.steps_per_epoch:
            self.data.on_epoch_end()
            self._epoch, self._index = self._epoch + 1, 0
            self.data.on_epoch_begin()
        batch = self.data[self._index]
        self._index += 1
        return _tensors(batch)


class IteratorInput(ResumableInput):
    """A Python generator or iterator of batches: replayed on a resume."""

    def __init__(self, data: Any, steps_per_epoch: int | None):
        if steps_per_epoch is None:
            raise ValueError("data is a Python generator (it cannot tell its length): pass steps_per_epoch.")
        self.data, self.steps_per_epoch = data, steps_per_epoch
        self._taken = 0

    def start(self, context: Any, state: bytes | None, epoch: int, skip: int) -> None:
        self._context = context
        for _ in range(skip):
            self._next()

    def _next(self) -> Any:
        try:
            batch = next(self.data)
        except StopIteration:
            raise ValueError(
                f"data: the generator ran out after {self._taken} batches; it must yield "
                "steps_per_epoch batches for every epoch left."
            ) from None
        self._taken += 1
        return _tensors(batch)


def resumable_input(data: Any, steps_per_epoch: Any = None) -> ResumableInput | None:
    """`data` as a `ResumableInput` when it is data kerasdist reads itself (a batched dataset, a
    PyDataset, a Python generator); None for data trainers rebuild per epoch (`make_dataset`'s, a
    function of the epoch). Refuses a dataset of single elements."""
    import keras

    steps = optional_integer("steps_per_epoch", steps_per_epoch, 1)
    if isinstance(data, keras.utils.PyDataset):
        return PyDatasetInput(data, steps)
    if isinstance(data, collections.abc.Iterator) and not isinstance(data, tf.data.Iterator):
        return IteratorInput(data, steps)
    if not isinstance(data, tf.data.Dataset):
        return None
    structure = dataset_structure(data)
    if not structure.batched:
        raise ValueError(
            "data is a tf.data.Dataset of single samples (it has no batch() after its last "
            "unbatch() or source): batch it (dataset.batch(global_batch_size)), or give it to "
            "distributed_fit with batch_size, which batches it."
        )
    return DatasetInput(data, structure, steps)


def resume_rule(data: Any) -> str:
    """What a resume does with `data` (a batched dataset, a PyDataset, a Python generator), in
    one sentence: at the next unseen batch exactly, and what its checkpoints keep, or otherwise
    what it does and how to make it exact."""
    source = None if made_by_make_dataset(data) else resumable_input(
        data, 1 if isinstance(data, collections.abc.Iterator) else None)
    if source is None:
        return ("continues at the next unseen batch: data made by make_dataset (or a function of the "
                "epoch) is rebuilt at the epoch and batch resumed")
    return _rule_text(source)


def made_by_make_dataset(data: Any) -> bool:
    """make_dataset's data, whose every epoch is rebuilt at the point resumed (a pure function of
    the seed and the epoch): it keeps no reader's position."""
    from kerasdist.data.info import dataset_info

    try:
        dataset_info(data)
    except (ValueError, TypeError):
        return False
    return True


def say_how_it_resumes(source: ResumableInput) -> None:
    """Once, at the start: what a resume will do with data it cannot continue exactly."""
    if source.rule in _EXACT_HINTS:
        warnings.warn(f"data: {_rule_text(source)}.", InputWarning, stacklevel=3)


def _rule_text(source: ResumableInput) -> str:
    external = ", ".join(getattr(getattr(source, "structure", None), "external", ()) or ()) or "some ops"
    text = RULES[source.rule].format(external=external)
    hint = _EXACT_HINTS.get(source.rule)
    return f"{text}; to resume exactly, {hint}" if hint else text


def replica_rows(rows: int, replicas: int) -> list[tuple[int, int]]:
    """Each replica's rows [begin, end) of a batch of `rows`: consecutive, sizes differing by at
    most one, the larger first (tf.distribute's rebatch)."""
    base, extra = divmod(rows, replicas)
    bounds, begin = [], 0
    for replica in range(replicas):
        end = begin + base + (1 if replica < extra else 0)
        bounds.append((begin, end))
        begin = end
    return bounds


def _rows(batch: Any) -> int:
    first = tf.nest.flatten(batch)[0]
    if isinstance(first, tf.SparseTensor):
        return int(first.dense_shape[0])
    return int(first.shape[0]) if first.shape[0] is not None else int(tf.shape(first)[0])


def _slice(tensor: Any, begin: int, end: int) -> Any:
    if isinstance(tensor, tf.SparseTensor):
        size = [end - begin, *tensor.dense_shape[1:]]
        return tf.sparse.slice(tensor, [begin] + [0] * (len(size) - 1), size)
    return tensor[begin:end]


def _tensors(batch: Any) -> Any:
    """A batch from Python (NumPy arrays, lists) as tensors; a list at the top is (x, y, ...)."""
    if isinstance(batch, list):
        batch = tuple(batch)
    return tf.nest.map_structure(tf.convert_to_tensor, batch)


# input.bin: a tag, the batches to read again, the batches of the pass before that state, whether
# a pass was counted before the run's first iterator, then tf.data's state (none: the run's first
# iterator). Written before: "kdp2" (no count field) and "kdp1" (no pass field either).
_POSITION = struct.Struct("<4sQQB")
_POSITION_V2 = struct.Struct("<4sQQ")
_POSITION_V1 = struct.Struct("<4sQ")


def _encoded(position: bytes | None, read_again: int, into_pass: int, counted_first: bool) -> bytes:
    return _POSITION.pack(b"kdp3", read_again, into_pass, counted_first) + (position or b"")


def _decoded(state: bytes) -> tuple[bytes | None, int, int, bool]:
    """(tf.data's state or None for the run's first iterator, the batches to read again, the
    batches of the pass before that state, whether a pass was counted before the first iterator)."""
    tag = state[:4]
    if tag == b"kdp1":
        _, read_again = _POSITION_V1.unpack_from(state)
        return state[_POSITION_V1.size:], read_again, 0, False
    if tag == b"kdp2":
        _, read_again, into_pass = _POSITION_V2.unpack_from(state)
        return state[_POSITION_V2.size:], read_again, into_pass, False
    if tag != b"kdp3":
        raise ValueError("data: the checkpoint's input position is of an unknown format (a newer kerasdist?).")
    _, read_again, into_pass, counted_first = _POSITION.unpack_from(state)
    return state[_POSITION.size:] or None, read_again, into_pass, bool(counted_first)


def _warn_no_position(epoch: int, skip: int) -> None:
    warnings.warn(
        f"The checkpoint keeps no position of this data (it was written by an older kerasdist or "
        f"for other data): it resumes epoch {epoch} by reading and discarding its first {skip} "
        f"batches, from the start of a new pass.",
        InputWarning, stacklevel=4,
    )


def _first_line(error: Exception) -> str:
    return str(getattr(error, "message", error)).strip().splitlines()[0]
