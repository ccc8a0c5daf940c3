"""tf.data instantiates every dataset function again for each new iterator, as a multi-device
function Grappler optimizes each time: `map_on_cpu` and `flat_map_on_cpu` build kerasdist's own
pipeline steps as single-device functions instead (gated on the TensorFlow versions checked; why
and the canaries: docs/upstream.md, bench/README.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, structured_function
from tensorflow.python.ops import gen_dataset_ops

from kerasdist.compat.versions import version_within

# TensorFlow releases whose tf.data runs Grappler on every function of every new iterator (2.21 checked).
DATA_FUNCTION_FIX_VERSIONS = ((2, 0), (2, 22))
_ON_ITS_DEVICE = {"experimental_ints_on_device": True}  # captured_function.cc: single-device, no Grappler


def tensorflow_optimizes_data_functions(version: str = tf.__version__) -> bool:
    return version_within(version, DATA_FUNCTION_FIX_VERSIONS)


def map_on_cpu(dataset: tf.data.Dataset, fn: Callable[..., Any]) -> tf.data.Dataset:
    """`dataset.map(fn)`, with `fn` instantiated for each new iterator without Grappler, unless it
    returns int32 tensors: under the mark those become `_DeviceRetval` nodes, which tf.data's own
    graph optimizers (inject_prefetch, with autotuning on) do not take for a function's results,
    so a function with two results, one of them int32, fails when an iterator is made ("Expected
    only one fetch node"). Such a function is mapped as usual."""
    if tensorflow_optimizes_data_functions():
        marked = _marked_function(fn, "Dataset.map()", dataset)
        if not any(spec.dtype == tf.int32 for spec in tf.nest.flatten(marked.output_structure)):
            return _SingleDeviceFunctionDataset(dataset, marked, flat=False)
    return dataset.map(fn)


def flat_map_on_cpu(dataset: tf.data.Dataset, fn: Callable[..., Any]) -> tf.data.Dataset:
    """`dataset.flat_map(fn)`, with `fn` instantiated for each new iterator without Grappler (its
    one result is a dataset, never an int32 tensor)."""
    if not tensorflow_optimizes_data_functions():
        return dataset.flat_map(fn)
    return _SingleDeviceFunctionDataset(dataset, _marked_function(fn, "Dataset.flat_map()", dataset), flat=True)


def _marked_function(fn: Callable[..., Any], transformation: str, dataset: Any) -> Any:
    """`fn` traced for `dataset`'s elements with the single-device mark. Not yet added to the
    graph being built (inside another dataset function): the dataset op that uses it adds it, and
    an unused marked function would still be optimized, and could fail, with the others."""
    return structured_function.StructuredFunctionWrapper(
        fn, transformation, dataset=dataset, add_to_graph=False, defun_kwargs=dict(_ON_ITS_DEVICE))


class _SingleDeviceFunctionDataset(dataset_ops.UnaryDataset):
    """tf.data's MapDataset or FlatMapDataset as `Dataset.map` / `flat_map` build them (map_op.py,
    flat_map_op.py), over a function traced by `_marked_function`."""

    def __init__(self, input_dataset: Any, marked: Any, flat: bool):
        self._input_dataset = input_dataset
        self._fn = marked
        output = marked.output_structure
        self._structure = output._element_spec if flat else output
        self._name = None
        function, upstream = marked.function, input_dataset._variant_tensor
        if flat:
            variant = gen_dataset_ops.flat_map_dataset(
                upstream, function.captured_inputs, f=function, **self._common_args)
        else:
            variant = gen_dataset_ops.map_dataset(
                upstream, function.captured_inputs, f=function, use_inter_op_parallelism=True,
                preserve_cardinality=True, force_synchronous=False, **self._common_args)
        super().__init__(input_dataset, variant)

    def _functions(self) -> list[Any]:
        return [self._fn]

    @property
    def element_spec(self) -> Any:
        return self._structure
