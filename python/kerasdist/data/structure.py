"""What a `tf.data.Dataset` a user brings is, read from its own graph (never guessed from the
shapes of its elements): whether its elements are batches, of how many samples, and what of its
state tf.data can save (`DatasetStructure`).

Batched: the op nearest the end of the pipeline that decides it (following the input of maps,
filters, prefetches, caches, shuffles, repeats, ... and into the dataset an interleave's or
flat_map's function returns) is a batching op (`batch`, `padded_batch`, `ragged_batch`,
`rebatch`, map-and-batch, a `group_by_window` whose reducer batches) rather than `unbatch` or a
source of single elements (`from_tensor_slices`, file readers, `range`). A source that says
nothing of batches (`from_tensors`, `from_generator`, a window) is taken as Keras takes every
dataset: as batches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kerasdist import compat

_BATCHING = frozenset({
    "BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset",
    "MapAndBatchDataset", "ExperimentalMapAndBatchDataset", "DenseToSparseBatchDataset",
    "ExperimentalDenseToSparseBatchDataset", "RebatchDataset", "RebatchDatasetV2", "ExperimentalRebatchDataset",
})
_UNBATCHING = frozenset({"UnbatchDataset", "ExperimentalUnbatchDataset"})
_ELEMENT_SOURCES = frozenset({
    "TensorSliceDataset", "SparseTensorSliceDataset", "RangeDataset", "TFRecordDataset", "TFRecordDatasetV2",
    "TextLineDataset", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2",
    "ExperimentalCSVDataset", "SqlDataset", "ExperimentalSqlDataset", "ListFilesDataset", "RandomDataset",
    "ExperimentalRandomDataset", "RandomDatasetV2", "CounterDataset",
})
# Ops whose elements come from the dataset a function returns: (op, the function's attribute).
_FROM_FUNCTION = {"FlatMapDataset": "f", "InterleaveDataset": "f", "ParallelInterleaveDataset": "f",
                  "ParallelInterleaveDatasetV2": "f", "ParallelInterleaveDatasetV3": "f",
                  "ParallelInterleaveDatasetV4": "f", "GroupByWindowDataset": "reduce_func",
                  "ExperimentalGroupByWindowDataset": "reduce_func"}
# Ops whose data inputs come after other inputs (a selector): the index of their first data input.
_DATA_INPUT = {"DirectedInterleaveDataset": 1, "ExperimentalDirectedInterleaveDataset": 1,
               "ChooseFastestBranchDataset": 0}
Batching = tuple[bool, "int | None", "bool | None"]  # (batched, batch size, drop_remainder)
_UNSAVEABLE = frozenset({"GeneratorDataset"})  # holds a Python iterator: no state to save at all
# Ops of pipelines whose iterator state TensorFlow 2.21 restores exactly at every point of a pass
# as a symbolic checkpoint: in-memory slices, maps, filters, batches, prefetch. Checked by
# tests/python/test_user_data.py's kinds. No shuffle: tf.data saves a shuffle's buffer in a
# symbolic checkpoint too, and a symbolic shuffle spends time in proportion to its buffer on every
# element (bench/history/probes/probe_symbolic_shuffle.py); a pipeline with one is "pass start".
DIRECT_OPS = frozenset({
    "TensorSliceDataset", "RangeDataset", "ZipDataset", "MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2",
    "FilterDataset", "BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2",
    "ParallelBatchDataset", "PrefetchDataset", "OptionsDataset", "ModelDataset",
    "MaxIntraOpParallelismDataset", "PrivateThreadPoolDataset", "TakeDataset", "SkipDataset",
})


@dataclass(frozen=True)
class DatasetStructure:
    """What a dataset is, from its graph.

    Attributes:
        batched: whether its elements are batches (see the module's docstring).
        batch_size: samples per batch when a batching op gives a constant, else None.
        drop_remainder: whether that op drops a last, short batch (None when not known).
        saved: what a checkpoint keeps of its reader's position: "positions" (the iterator's
            state where it is, as a symbolic checkpoint: for a pipeline made only of
            `DIRECT_OPS`, without a shuffle, whose restore was checked exact everywhere in a
            pass), "elements" (the iterator's state where it is, with the elements its ops hold:
            for any other pipeline without a shuffle; a symbolic restore of a parallel interleave
            hangs on TensorFlow 2.21),
            "pass start" (for any other pipeline: the iterator's state where it is when it holds
            every shuffle's random state, else its last state that did (at worst the run's
            first), and the batches read since, read again on resume: TensorFlow 2.21
            restores a state that lacks a shuffle's seed-generator count wrongly, the family of
            tensorflow#48178, see compat/tf_data_state.py), "without external state" (a
            pass start without the state of the ops that live outside the pipeline, `external`),
            or "nothing" (a generator: it is replayed instead).
        external: the ops whose state tf.data cannot save (a stateful random op, a py_function,
            a generator), as tf.data names them; empty when there are none.
        shuffles: how many shuffles the pipeline has (None when one is inside a function, as
            in an interleave's: its iterators come and go with the elements).
    """

    batched: bool
    batch_size: int | None = None
    drop_remainder: bool | None = None
    saved: str = "elements"
    external: tuple[str, ...] = ()
    shuffles: int | None = 0


def dataset_structure(dataset: Any) -> DatasetStructure:
    """`dataset`'s structure, read from its graph."""
    graph = compat.dataset_graph(dataset)
    batched, size, drop = _batching(graph)
    saved, external = _saved(dataset, graph)
    return DatasetStructure(batched, size, drop, saved, external, _shuffles(graph))


def _batching(graph: Any) -> Batching:
    """(batched, batch size, drop_remainder) of the op nearest the output that decides it."""
    nodes = {node.name: node for node in graph.node}
    functions = {function.signature.name: function for function in graph.library.function}
    node = nodes[compat.dataset_output(graph)]
    return _walk(node, nodes, functions)


def _walk(node: Any, nodes: dict[str, Any], functions: dict[str, Any]) -> Batching:
    for _ in range(10_000):  # a pipeline is a chain; the bound only guards against a cycle
        if node.op in _BATCHING:
            size_at = -3 if "MapAndBatch" in node.op else 1
            size = None if "Rebatch" in node.op else _constant_input(node, size_at, nodes)
            return True, size, _constant_input(node, -1, nodes, bool)
        if node.op in _UNBATCHING or node.op in _ELEMENT_SOURCES:
            return False, None, None
        if node.op in _FROM_FUNCTION:
            inner = _returned_dataset(node, _FROM_FUNCTION[node.op], functions)
            return inner if inner is not None else (True, None, None)
        inputs = [name for name in node.input if not name.startswith("^")]
        index = _DATA_INPUT.get(node.op, 0)
        if len(inputs) <= index or _input_name(inputs[index]) not in nodes:
            return True, None, None  # a source that says nothing of batches: as Keras, batches
        node = nodes[_input_name(inputs[index])]
    return True, None, None


def _returned_dataset(node: Any, attribute: str, functions: dict[str, Any]) -> Batching | None:
    """What the dataset `node`'s function returns is, walked inside that function."""
    function = functions.get(node.attr[attribute].func.name)
    if function is None or not function.ret:
        return None
    inner_nodes = {n.name: n for n in function.node_def}
    returned = _input_name(next(iter(function.ret.values())))
    if returned not in inner_nodes:
        return None  # the function returns one of its arguments: a dataset made outside it
    return _walk(inner_nodes[returned], inner_nodes, functions)


def _input_name(name: str) -> str:
    """A node's input as the name of the node it comes from ("x:output:0" and "x:0" -> "x")."""
    return name.lstrip("^").split(":")[0]


def _constant_input(node: Any, index: int, nodes: dict[str, Any], kind: type = int) -> Any:
    """The value of `node`'s input `index` when it is a constant scalar, else None."""
    inputs = [name for name in node.input if not name.startswith("^")]
    if not -len(inputs) <= index < len(inputs):
        return None
    source = nodes.get(_input_name(inputs[index]))
    if source is None or source.op != "Const":
        return None
    value = source.attr["value"].tensor
    values = list(value.int64_val) or list(value.int_val) or list(value.bool_val)
    return kind(values[0]) if len(values) == 1 else None


_SHUFFLES = frozenset({"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                       "ShuffleAndRepeatDatasetV2"})


def _shuffles(graph: Any) -> int | None:
    """The number of shuffles in `graph`, None when a function holds one."""
    if any(node.op in _SHUFFLES for function in graph.library.function for node in function.node_def):
        return None
    return sum(1 for node in graph.node if node.op in _SHUFFLES)


def _saved(dataset: Any, graph: Any) -> tuple[str, tuple[str, ...]]:
    """What a checkpoint can keep of `dataset`'s position, and the ops whose state it cannot."""
    ops = {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def}
    if ops & _UNSAVEABLE:
        return "nothing", tuple(sorted(ops & _UNSAVEABLE))
    try:
        compat.dataset_graph(dataset, external_state="fail")
    except Exception as error:  # tf.errors.FailedPreconditionError: "<Op> is stateful"
        return "without external state", tuple(re.findall(r"(\w+) is stateful", str(error))) or ("?",)
    pipeline = {node.op for node in graph.node if node.op.endswith("Dataset") or "Dataset" in node.op}
    shuffles = sum(1 for node in graph.node if node.op in _SHUFFLES)
    if shuffles:
        return "pass start", ()
    return ("positions" if pipeline <= DIRECT_OPS and not ops & compat.SYMBOLIC_REFUSED else "elements"), ()
