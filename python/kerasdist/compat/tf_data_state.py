"""tf.data's own view of a pipeline and of an iterator's position, which TensorFlow exposes only
through private names: a dataset's graph (what `data/structure.py` reads: is it batched, by how
many, can its state be saved) and an iterator's state as bytes (what a checkpoint keeps of the
data users bring, `data/resumable.py`).

An iterator's state is what `tf.train.Checkpoint(iterator=it)` writes (`SerializeIterator`), as
one serialized tensor: the reader's positions, the shuffle's random state and, for ops that keep
elements (a shuffle buffer, a prefetch buffer, a cache being filled), those elements.
`symbolic=True` (`tf.data.Options().experimental_symbolic_checkpoint`) keeps positions instead of
the elements wherever the op allows it; the ops that refuse it are `SYMBOLIC_REFUSED` (checked on
TensorFlow 2.21 by tests/python/test_compat.py). Symbolic checkpoints do not check the pipeline's
external state (a stateful `tf.random.uniform` in a `map` is not saved and resumes otherwise
without a word), so kerasdist asks for them only where the pipeline has none
(`dataset_graph(..., external_state="fail")` passes).

A shuffle's random state is in two places: each of its iterators keeps its own seeds, and the
dataset keeps a seed generator, shared by every iterator made from it, that draws the seeds of
its next iterator (of the next pass, when reshuffled each pass). An iterator's state holds that
generator's count (`epoch_num_random_samples`) only while the shuffle has a live iterator. An
op drops its input's iterator once that input is exhausted (a parallel interleave once every
file of the pass is open; a shuffle once its buffer holds the rest of its input) and opens its
input lazily (a shuffle at its first element). A state taken then keeps no count, and a restore
leaves the generator where the new process's own iterators left it, so the next pass is
shuffled otherwise (measured on TensorFlow 2.21 across processes: every state that held every
shuffle's count restored exactly; most of the others did not). `shuffle_counts_kept` tells them
apart.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.ops import gen_dataset_ops

from kerasdist.compat.versions import version_within

# TensorFlow releases whose private iterator and graph ops these use (2.21 checked).
ITERATOR_STATE_VERSIONS = ((2, 13), (2, 22))

# Dataset ops whose iterators refuse symbolic checkpoints ("... does not support symbolic
# checkpointing"), measured on TensorFlow 2.21; GeneratorDataset cannot be saved at all.
SYMBOLIC_REFUSED = frozenset({
    "CacheDataset", "CacheDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset",
    "WindowDataset", "GroupByWindowDataset", "ExperimentalGroupByWindowDataset",
    "GroupByReducerDataset", "IgnoreErrorsDataset", "ExperimentalIgnoreErrorsDataset",
    "SnapshotDataset", "SnapshotDatasetV2", "SnapshotDatasetReader", "UniqueDataset",
    "ExperimentalUniqueDataset", "GeneratorDataset", "DataServiceDatasetV4",
    "LoadDataset", "SaveDatasetV2", "SlidingWindowDataset",
})

_EXTERNAL_STATE = {"warn": 0, "ignore": 1, "fail": 2}


def tensorflow_iterator_state_supported(version: str = tf.__version__) -> bool:
    """Whether this TensorFlow is one whose iterator state and dataset graph were checked."""
    return version_within(version, ITERATOR_STATE_VERSIONS)


def dataset_graph(dataset: tf.data.Dataset, external_state: str = "ignore") -> graph_pb2.GraphDef:
    """`dataset`'s graph, its function library included. `external_state="fail"` raises
    `tf.errors.FailedPreconditionError` naming the first op whose state lives outside the
    pipeline (a stateful random op, a `py_function`, a generator)."""
    serialized = gen_dataset_ops.dataset_to_graph_v2(
        dataset._variant_tensor, external_state_policy=_EXTERNAL_STATE[external_state])
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


def dataset_output(graph: graph_pb2.GraphDef) -> str:
    """The name of the node whose output is the dataset `dataset_graph` serialized."""
    returned = next(node for node in graph.node if node.op == "_Retval")
    return returned.input[0].split(":")[0]


def iterator_state(iterator: Any, ignore_external_state: bool = False) -> bytes:
    """The position of `iterator` (a `tf.data.Iterator` made in eager mode) as bytes. With
    `ignore_external_state`, state outside the pipeline (stateful random ops) is left out
    instead of refused."""
    policy = _EXTERNAL_STATE["ignore" if ignore_external_state else "fail"]
    state = gen_dataset_ops.serialize_iterator(iterator._iterator_resource, external_state_policy=policy)
    return tf.io.serialize_tensor(state).numpy()


def shuffle_counts_kept(state: bytes) -> int:
    """How many shuffles' seed-generator counts an `iterator_state` holds (see the module's
    docstring: a state restores exactly where it holds one for every shuffle of the pipeline)."""
    return state.count(_SEED_GENERATOR_COUNT)


_SEED_GENERATOR_COUNT = b"epoch_num_random_samples"  # the key shuffle_dataset_op.cc saves it under


def restore_iterator_state(iterator: Any, state: bytes) -> None:
    """Move `iterator` (over the same pipeline that `state` was taken from) to `state`."""
    gen_dataset_ops.deserialize_iterator(iterator._iterator_resource, tf.io.parse_tensor(state, tf.variant))
