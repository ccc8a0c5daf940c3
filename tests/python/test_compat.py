"""Canaries of the workarounds that moved into the compat package with #46: Keras variables'
increments made atomic for parameter-server steps (`compat.keras_variables`), `model.save` in two
halves for background snapshots (`compat.keras_saving`), `load_weights` reading in place and a
build restored at once (`compat.keras_loading`). Each fails when upstream changes: first where the
workaround stops being needed or stops working, then where its version gate ends (make
upstream-check runs them on the next Keras, tools/upstream_check.py). At the end, the canaries of
the private names kerasdist reads through compat (no patch, no gate): they fail when upstream
renames one or changes what it holds."""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
import zlib
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasdist import compat


def _traced_update_ops(variable: keras.Variable) -> set[str]:
    """The op types of a step that increments and decrements `variable`, traced now."""

    @tf.function
    def step() -> None:
        variable.assign_add(1.0)
        variable.assign_sub(0.5)

    return {op.type for op in step.get_concrete_function().graph.get_operations()}


def test_keras_variable_increments_are_still_a_read_and_a_separate_write():
    """Why compat.atomic_variable_increments exists: Keras's `assign_add` traces as a read, an add
    and a plain assign, which two parameter-server workers can interleave (an increment lost).
    Fails once Keras increments with TensorFlow's own atomic op: then drop the patch."""
    variable = keras.Variable(0.0)
    as_released = _traced_update_ops(variable)
    assert "AssignVariableOp" in as_released and "ReadVariableOp" in as_released
    assert not {"AssignAddVariableOp", "AssignSubVariableOp"} & as_released
    assert compat.keras_needs_atomic_increments(), keras.__version__
    assert not compat.keras_needs_atomic_increments("3.16.0")


def test_within_the_block_increments_are_one_atomic_op_and_keras_comes_back_after_it():
    from keras.src.backend.tensorflow.core import Variable

    variable = keras.Variable(0.0)
    with compat.atomic_variable_increments(force=True):
        patched = _traced_update_ops(variable)
        variable.assign_add(2.0)  # eagerly too
        variable.assign_sub(0.5)
        with keras.StatelessScope():  # a stateless scope writes no variable, as in Keras
            variable.assign_add(100.0)
    assert {"AssignAddVariableOp", "AssignSubVariableOp"} <= patched
    assert "AssignVariableOp" not in patched
    assert float(variable.numpy()) == 1.5
    assert "assign_add" not in Variable.__dict__ and "assign_sub" not in Variable.__dict__
    assert "AssignVariableOp" in _traced_update_ops(variable)  # Keras's own again


def _dense_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), epochs=1, verbose=0)
    return model


def _lookup_model() -> keras.Model:
    """With an asset (the adapted vocabulary) and an optimizer state."""
    inputs = keras.Input((1,), dtype="string")
    lookup = keras.layers.StringLookup()
    lookup.adapt(["a", "b", "c"])
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(5, 2)(lookup(inputs))))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    model.fit(tf.constant([["a"], ["z"]]), tf.ones((2, 1)), epochs=1, verbose=0)
    return model


def _copied(value: object) -> np.ndarray:
    return np.array(value.numpy() if hasattr(value, "numpy") else value)


class _WeightsBytes(io.BytesIO):
    def lend(self, array) -> None:
        pass  # copies every write

    def view(self) -> memoryview:
        return self.getbuffer()


def _members(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_recorded_walk_replayed_writes_model_saves_files():
    """Why compat.record_save / write_keras_zip may stand in for `model.save` in background
    snapshots: Keras's walk recorded, then replayed into Keras's store, gives the zip `model.save`
    writes, member for member, byte for byte (metadata.json holds the time), for a model with an
    optimizer state and one with assets. Fails once Keras's saving internals move or write
    something else, then where the version gate ends (check checkpoint/snapshot.py, then widen
    keras_saving.KERAS_SNAPSHOT_VERSIONS). One test, not parametrized: make upstream-check runs it by name."""
    for model in (_dense_model(), _lookup_model()):
        expected = _members(compat.keras_model_bytes(model))
        recorded = compat.record_save(model, _copied)
        archive = io.BytesIO()
        member, _ = compat.write_keras_zip(recorded, archive, lambda name: _WeightsBytes())
        got = _members(archive.getvalue())
        assert list(got) == list(expected), model.name  # the same members in the same order
        assert member.filename == "model.weights.h5"
        for name in expected:
            if name != "metadata.json":
                assert got[name] == expected[name], (model.name, name)
    assert any(name.startswith("assets/") for name in got), list(got)
    assert compat.keras_snapshot_supported(), keras.__version__
    assert not compat.keras_snapshot_supported("3.16.0")


def test_a_zip_member_written_without_its_crc_is_zipfiles_once_filled_in():
    """Why compat.write_keras_zip may leave the weights member's CRC-32 to the writer (#47): a
    member written through zipfile's member writer with `crc_later`, its CRC-32 fields (local
    header, central directory) then filled in, is byte for byte zipfile's own `writestr`. Fails
    once zipfile's member writer changes, then where the version gate ends (check
    compat/keras_saving.py `_write_member`, then widen compat.ZIP_CRC_LATER_PYTHONS)."""
    from kerasdist.compat.keras_saving import _write_member

    data = os.urandom(100_000)
    for _ in range(3):  # both stamped in the same second
        made = []
        for later in (False, True):
            archive_bytes = io.BytesIO()
            with zipfile.ZipFile(archive_bytes, "w") as archive:
                archive.writestr("a.json", "{}")
                left = _write_member(archive, "w.h5", memoryview(data), False, later)
            made.append((archive_bytes.getvalue(), left))
        if made[0][0][10:14] == made[1][0][10:14]:
            break
    (zipfiles, left_before), (ours, left) = made
    assert not left_before and left
    local, central = zipfiles.index(b"PK\x03\x04", 1), zipfiles.rindex(b"PK\x01\x02")
    crc = zlib.crc32(data).to_bytes(4, "little")
    assert ours[local + 14:local + 18] == ours[central + 16:central + 20] == bytes(4)
    assert ours[:local + 14] + crc + ours[local + 18:central + 16] + crc + ours[central + 20:] == zipfiles
    assert compat.zip_crc_later_supported()
    assert not compat.zip_crc_later_supported("3.14")


def _state(model: keras.Model) -> list[bytes]:
    return [np.asarray(v.numpy()).tobytes() for v in [*model.weights, *model.optimizer.variables]]


def _zeroed(model: keras.Model) -> keras.Model:
    for variable in [*model.weights, *model.optimizer.variables]:
        variable.assign(np.zeros(variable.shape, variable.dtype))
    return model


def _open_descriptors() -> int:
    """This process's open descriptors, once two counts 20 ms apart agree: another test's thread
    left running in this pytest process may hold one for a moment; a leak stays."""
    counts = [len(os.listdir("/proc/self/fd"))]
    for _ in range(50):
        time.sleep(0.02)
        counts.append(len(os.listdir("/proc/self/fd")))
        if counts[-1] == counts[-2]:
            break
    return counts[-1]


def test_weights_read_in_place_are_those_load_weights_reads(tmp_path, monkeypatch):
    """Why compat.load_keras_weights may stand in for `model.load_weights(x.keras)` on restores:
    Keras's own `H5IOStore`/`_load_state` over the stored weights member read in place load every
    layer's and the optimizer's variables bit for bit as `load_weights` does, for a Dense + Adam
    model and one with nested layers and an asset, and leave no file open. Outside the Keras
    versions checked, and for a compressed member, it is `load_weights` itself. Fails once Keras's
    loading internals move or load something else, then where the version gate ends (widen
    keras_loading.KERAS_LOAD_IN_PLACE_VERSIONS). One test: make upstream-check runs it by name."""
    from kerasdist.compat import keras_loading

    for model in (_dense_model(), _lookup_model()):
        path = tmp_path / f"{model.name}.keras"
        model.save(path)
        saved = _state(model)
        assert any(value.strip(b"\0") for value in saved[len(model.weights):]), "the optimizer state is zeros"
        _zeroed(model).load_weights(path)
        assert _state(model) == saved, model.name
        descriptors = _open_descriptors()
        assert compat.load_keras_weights(_zeroed(model), path) is True
        assert _state(model) == saved, model.name
        assert _open_descriptors() == descriptors
    compressed = tmp_path / "compressed.keras"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as target:
        for name in source.namelist():
            target.writestr(name, source.read(name))
    assert compat.load_keras_weights(_zeroed(model), compressed) is False
    assert _state(model) == saved
    assert compat.keras_loads_weights_in_place(), keras.__version__
    assert not compat.keras_loads_weights_in_place("3.16.0")
    assert not compat.keras_loads_weights_in_place("3.14.0")
    monkeypatch.setattr(keras_loading, "KERAS_LOAD_IN_PLACE_VERSIONS", ((3, 0), (3, 1)))  # a Keras not checked
    assert compat.load_keras_weights(_zeroed(model), path) is False
    assert _state(model) == saved
    assert compat.load_keras_weights(_zeroed(model), path, force=True) is True
    assert _state(model) == saved


def _initialized_model() -> keras.Model:
    """Keras's default (int-seeded) initializers, one seeded by a SeedGenerator, an orthogonal one."""
    keras.utils.set_random_seed(7)
    by_generator = keras.initializers.RandomNormal(seed=keras.random.SeedGenerator(3))
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                             keras.layers.Dense(2, kernel_initializer=by_generator),
                             keras.layers.Dense(1, kernel_initializer="orthogonal")])


def _values(model: keras.Model) -> list[bytes]:
    return [np.asarray(v.numpy()).tobytes() for v in model.weights]


def _overlap_blocks_in_two_threads() -> None:
    """Two threads' `initializers_deferred` blocks overlapping (A in, B in, A out, B out), each
    making a model inside; each thread's deferred kernels are its own."""
    import threading

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    counts: dict[str, int] = {}

    def block(name: str, entered: threading.Event, wait_for: threading.Event, done: threading.Event | None) -> None:
        with compat.initializers_deferred() as deferred:
            entered.set()
            wait_for.wait(30)
            _initialized_model()
            counts[name] = deferred.deferred
        if done is not None:
            done.set()

    threads = [threading.Thread(target=block, args=("a", a_in, b_in, a_out)),
               threading.Thread(target=block, args=("b", b_in, a_out, None))]
    threads[0].start()
    a_in.wait(30)
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert counts == {"a": 2, "b": 2}, counts


def test_deferred_initializers_give_the_values_of_a_plain_build(monkeypatch):
    """Why a build about to be restored may skip its random initializers: inside
    `initializers_deferred`, variables whose initializer is random with an int seed start as
    zeros, those no assignment reaches get, at the block's end (raised or not), exactly the values
    a plain build gives; assigned ones keep what was assigned; a SeedGenerator-seeded initializer
    and non-random ones run as usual; Keras's Variable is as it was afterwards. Fails once Keras
    makes or assigns variables elsewhere, or its initializers draw seeds differently, then where
    the version gate ends (widen keras_loading.KERAS_DEFERRED_INIT_VERSIONS). make upstream-check runs it
    by name."""
    from keras.src.backend import Variable as BackendVariable
    from keras.src.backend.common.variables import Variable as CommonVariable

    from kerasdist.compat import keras_loading

    plain = _values(_initialized_model())
    originals = (BackendVariable._initialize_with_initializer, CommonVariable.assign)
    with compat.initializers_deferred() as deferred:
        model = _initialized_model()
        assert deferred.deferred == 2  # the two int-seeded kernels
        first, _, last = (layer.kernel for layer in model.layers)
        assert not first.numpy().any() and not last.numpy().any()
        assert _values(model)[2:4] == plain[2:4]  # the SeedGenerator's kernel and a zeros bias
        first.assign(np.ones(first.shape, "float32"))
    assert (first.numpy() == 1).all()
    assert _values(model)[1:] == plain[1:]  # the unassigned kernel drawn at the end, as a build draws it
    assert (BackendVariable._initialize_with_initializer, CommonVariable.assign) == originals
    try:
        with compat.initializers_deferred():
            model = _initialized_model()
            raise RuntimeError("a restore failing")
    except RuntimeError:
        pass
    assert _values(model) == plain
    with compat.initializers_deferred(enabled=False) as deferred:
        assert _values(_initialized_model()) == plain and deferred.deferred == 0
    _overlap_blocks_in_two_threads()  # A enters, B enters, A leaves, B leaves
    assert (BackendVariable._initialize_with_initializer, CommonVariable.assign) == originals
    assert _values(_initialized_model()) == plain  # nothing left deferred, on any thread
    assert compat.keras_defers_initializers(), keras.__version__
    assert not compat.keras_defers_initializers("3.16.0")
    assert not compat.keras_defers_initializers("3.14.0")
    monkeypatch.setattr(keras_loading, "KERAS_DEFERRED_INIT_VERSIONS", ((3, 0), (3, 1)))  # a Keras not checked
    with compat.initializers_deferred() as deferred:
        assert _values(_initialized_model()) == plain and deferred.deferred == 0


def _large_model(seed: int = 11) -> keras.Model:
    """Variables of 1 MiB and more (keras_loading.UNFILLED_FROM_BYTES: a random kernel, a ones one,
    Adam's slots of both), a float16 kernel, batch normalization's statistics; Adam built."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((1024,))
    x = keras.layers.Dense(1024)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dense(1024, kernel_initializer="ones")(x)
    outputs = keras.layers.Dense(8, dtype="float16")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_values_are_read_into_the_tensors_their_variables_take_over(tmp_path, monkeypatch):
    """Why compat.load_keras_weights reads each value once, into the memory its variable keeps:
    TensorFlow's `_numpy()` of a new CPU tensor is a writable view of the tensor's memory, and a
    variable assigned a tensor takes that memory over (no copy). So the load makes no array of a
    value's size (Keras's store made one and copied it, TensorFlow copied it again), and loads
    what `load_weights` loads bit for bit; outside the TensorFlow versions checked, Keras's
    arrays as before. Fails once TensorFlow copies either way, then where the version gate ends
    (widen keras_loading.TF_TENSOR_VIEW_VERSIONS). make upstream-check runs it by name."""
    import tracemalloc

    from keras.src.backend import Variable as BackendVariable

    from kerasdist.compat import keras_loading

    assert compat.tensorflow_reads_into_tensors(), tf.__version__
    assert not compat.tensorflow_reads_into_tensors("2.22.0")
    tensor = tf.raw_ops.Empty(shape=[3], dtype=tf.float32, init=False)
    tensor._numpy()[:] = [1.0, 2.0, 3.0]
    assert float(tf.reduce_sum(tensor * tf.constant([1.0, 10.0, 100.0]))) == 321.0
    variable = tf.Variable(tf.zeros([3]))
    variable.assign(tensor)
    assert variable.read_value()._numpy().ctypes.data == tensor._numpy().ctypes.data  # taken over
    model = _large_model()
    model.fit(np.ones((4, 1024), "float32"), np.ones((4, 8), "float32"), verbose=0)
    model.save(tmp_path / "large.keras")
    saved, largest = _state(model), max(len(value) for value in _state(model))
    _zeroed(model).load_weights(tmp_path / "large.keras")
    assert _state(model) == saved
    converts = BackendVariable.__dict__.get("_convert_to_tensor")
    for gate, most in ((None, largest // 8), (((2, 0), (2, 1)), largest)):  # as checked / a TF not checked
        if gate is not None:
            monkeypatch.setattr(keras_loading, "TF_TENSOR_VIEW_VERSIONS", gate)
        _zeroed(model)
        tracemalloc.start()
        try:
            assert compat.load_keras_weights(model, tmp_path / "large.keras") is True
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert _state(model) == saved
        assert (peak < most) == (gate is None), (peak, largest)
        assert BackendVariable.__dict__.get("_convert_to_tensor") is converts  # Keras's own again


# Run in a process of its own, where nothing else allocates: which pages of each large variable's
# buffer are resident (mincore), inside the deferred build, with the TensorFlow gate as checked and
# closed. Large allocations are fresh mappings (a fixed mmap threshold), and freed heap memory is
# given back first (malloc_trim), so a page is resident only once something wrote (or read) it.
UNFILLED_PROBE = """
import ctypes, json, mmap, sys
sys.path.insert(0, sys.argv[1])
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: 1 MiB, and no longer raised as memory is freed
import gc
import numpy as np
import pytest
from kerasdist import compat
from kerasdist.compat import keras_loading
from test_compat import _large_model, _state

def resident(variables):
    # (resident pages, pages) of the variables' buffers; the arrays are views, nothing is read
    found = total = 0
    for variable in variables:
        array = variable.value.read_value()._numpy()
        start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
        length = array.ctypes.data + array.nbytes - start
        pages = (ctypes.c_ubyte * (-(-length // mmap.PAGESIZE)))()
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), pages) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        found, total = found + sum(page & 1 for page in pages), total + len(pages)
    return found, total

def deferred_build(assign_first):
    gc.collect()
    libc.malloc_trim(0)
    with compat.initializers_deferred() as deferred:
        model = _large_model()
        large = [v for v in [*model.weights, *model.optimizer.variables]
                 if compat.variable_bytes(v) >= keras_loading.UNFILLED_FROM_BYTES]
        pages = resident(large)
        if assign_first:
            first = model.layers[1].kernel
            first.assign(np.full(first.shape, 2.0, "float32"))
    return {"deferred": deferred.deferred, "large": len(large), "resident": pages,
            "first_assigned": bool((model.layers[1].kernel.numpy() == 2.0).all()), "state": _state(model)}

def as_plain(build, plain):
    state = build.pop("state")
    return {**build, "rest_as_plain": state[1:] == plain[1:], "all_as_plain": state == plain}

# the process's first build is the one measured: TensorFlow's oneDNN CPU allocator (on by default
# on CPUs with AVX512_VNNI) pools large buffers, and a later build may get pages one before touched
checked = deferred_build(assign_first=True)
plain = _state(_large_model())
keras_loading.TF_TENSOR_VIEW_VERSIONS = ((2, 0), (2, 1))  # a TensorFlow not checked
not_checked = deferred_build(assign_first=False)
print(json.dumps({"checked": as_plain(checked, plain), "not_checked": as_plain(not_checked, plain)}))
"""


def test_large_variables_about_to_be_restored_start_unfilled():
    """Inside `initializers_deferred`, a variable of 1 MiB or more whose initializer is random
    with an int seed or constant (zeros, ones: Adam's slots) starts with its memory unfilled (none
    of its pages touched: the restore's value replaces it), and one no assignment reached gets its
    initializer's values at the block's end, as a plain build gives them; outside the TensorFlow
    versions checked they start filled. Fails once `tf.raw_ops.Empty` fills or Keras makes
    variables elsewhere (see test_deferred_initializers_give_the_values_of_a_plain_build).
    Measured by page, in a process of its own (UNFILLED_PROBE): a test process's resident memory
    also moves with what other threads free and reuse meanwhile."""
    from conftest import run_python

    done = run_python(UNFILLED_PROBE, str(Path(__file__).parent))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    checked, not_checked = result["checked"], result["not_checked"]
    # two large kernels (a random one, a ones one) and their four Adam slots: 6 x 4 MiB
    assert checked["large"] == not_checked["large"] == 6
    assert checked["deferred"] == 2 + 4 + 1  # the large ones and the small random kernel
    found, pages = checked["resident"]
    assert pages >= 6 * 1024 and found <= 2 * checked["large"], checked  # at most a page at each end
    assert checked["first_assigned"] and checked["rest_as_plain"]  # the rest as a plain build makes it
    assert not_checked["deferred"] == 2  # the random kernels as zeros, the rest filled at once
    found, pages = not_checked["resident"]
    assert found == pages, not_checked  # filled: every page written
    assert not_checked["all_as_plain"]


# -- what kerasdist reads of Keras and TensorFlow that they keep private (accessors, no patch) ------
# Each canary fails when upstream renames or changes what the accessor reads.

def _compiled(model: keras.Model, **compile_args) -> keras.Model:
    model.compile(optimizer="sgd", loss="mse", **compile_args)
    return model


def test_canary_layers_within_reaches_nested_models_layers():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="inner_dense")], name="inner")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="outer_dense")(inner(inputs)))
    names = [layer.name for layer in compat.layers_within(model)]
    assert names[0] == model.name and {"inner", "inner_dense", "outer_dense"} <= set(names)
    assert model.name not in [layer.name for layer in compat.layers_within(model, include_self=False)]
    assert compat.layers_within(object()) == []


def test_canary_compiled_metrics_and_wrapped_functions_are_what_compile_was_given():
    def my_metric(y_true, y_pred):
        return keras.ops.mean(y_pred)

    def my_loss(y_true, y_pred):
        return keras.ops.mean((y_true - y_pred) ** 2)

    model = _compiled(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
                      metrics=["mae", my_metric], weighted_metrics=[my_metric])
    assert compat.compiled_metrics(model) == (["mae", my_metric], [my_metric])
    assert compat.compiled_metrics(keras.Sequential([keras.layers.Dense(1)])) == (None, None)
    from keras.src.losses.losses import LossFunctionWrapper  # what Keras's losses of a function are

    assert compat.wrapped_function(LossFunctionWrapper(my_loss)) is my_loss
    assert isinstance(keras.losses.MeanSquaredError(), LossFunctionWrapper)
    assert compat.wrapped_function(keras.metrics.MeanMetricWrapper(my_metric)) is my_metric


def test_canary_the_optimizer_batch_counter_counts_batches_under_gradient_accumulation():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(gradient_accumulation_steps=2), loss="mse")
    model.fit(np.zeros((8, 3), "float32"), np.zeros(8, "float32"), batch_size=2, verbose=0)
    assert int(compat.optimizer_batch_counter(model.optimizer).numpy()) == 4  # batches
    assert int(model.optimizer.iterations.numpy()) == 2  # applied updates


def test_canary_a_symbolic_build_makes_every_variable_without_a_step():
    model = _compiled(keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(1)]), metrics=["mae"])
    compat.symbolic_build(model, (np.zeros((4, 3), "float32"), np.zeros((4, 1), "float32")))
    assert model.built and model.optimizer.built and model.metrics_variables
    assert int(model.optimizer.iterations.numpy()) == 0  # no step taken


def test_canary_a_variable_made_under_a_strategy_gives_its_replicas():
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        variable = keras.Variable(np.zeros(3, "float32"))
    (replica,) = compat.replica_variables(variable)
    assert replica is not variable and isinstance(replica, tf.Variable)
    replica.assign([1.0, 2.0, 3.0])
    assert variable.numpy().tolist() == [1.0, 2.0, 3.0]
    plain = keras.Variable(0.0)
    assert compat.replica_variables(plain) == (plain,)


def test_canary_tensorboard_keeps_its_open_writers_where_kerasdist_flushes_them(tmp_path):
    board = keras.callbacks.TensorBoard(str(tmp_path / "logs"))
    seen = []
    watch = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(
        compat.tensorboard_writers(board)))
    model = _compiled(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
    model.fit(np.zeros((4, 3), "float32"), np.zeros(4, "float32"), verbose=0, callbacks=[board, watch])
    assert seen[0] and all(callable(getattr(writer, "flush", None)) for writer in seen[0])


def test_canary_the_coordination_service_calls_kerasdist_makes_are_tensorflows():
    """`coordination_key_exists` and `wait_at_coordination_barrier` (the preemption agreement's)
    call TensorFlow's private eager context; without a coordination service (one process), a key
    is not there and a barrier refuses (the multi-worker tests use them with one)."""
    import inspect

    from tensorflow.python.eager import context

    assert list(inspect.signature(context.Context.get_config_key_value).parameters) == [
        "self", "key", "timeout_in_ms"]
    assert list(inspect.signature(context.Context.wait_at_barrier).parameters) == [
        "self", "barrier_id", "timeout_in_ms"]
    assert compat.coordination_key_exists("kerasdist-canary", 10) is False
    try:
        compat.wait_at_coordination_barrier("kerasdist-canary", 10)
    except tf.errors.FailedPreconditionError as err:
        assert "not enabled" in str(err)
    else:
        raise AssertionError("a barrier without a coordination service returned")


def test_canary_slurm_host_lists_are_read_as_the_slurm_resolver_reads_them():
    assert compat.slurm_tasks_per_host("n[1-2],m3", "2(x2),1") == {"n1": 2, "n2": 2, "m3": 1}
    assert compat.slurm_tasks_per_host("a[01-03]", "1(x3)") == {"a01": 1, "a02": 1, "a03": 1}


# -- the data users bring (#58): tf.data's iterator state, Keras's fit on kerasdist's stream -----


def test_canary_an_iterator_state_taken_as_bytes_resumes_a_new_iterator_exactly():
    """`iterator_state` / `restore_iterator_state`: the rest of a reshuffling stream, the next
    pass's order included, from the bytes of one iterator's state in another."""
    from kerasdist.compat.tf_data_state import tensorflow_iterator_state_supported

    assert tensorflow_iterator_state_supported()
    def stream():
        return tf.data.Dataset.range(12).shuffle(12, seed=1).batch(3).repeat()
    whole = [b.numpy().tolist() for b, _ in zip(stream(), range(10), strict=False)]
    first = iter(stream())
    [next(first) for _ in range(5)]
    state = compat.iterator_state(first)
    second = iter(stream())
    compat.restore_iterator_state(second, state)
    assert [next(second).numpy().tolist() for _ in range(5)] == whole[5:]
    with_random = tf.data.Dataset.range(4).map(lambda v: tf.cast(v, tf.float32) + tf.random.uniform([]))
    with pytest.raises(tf.errors.FailedPreconditionError, match="RandomUniform is stateful"):
        compat.iterator_state(iter(with_random))
    assert compat.iterator_state(iter(with_random), ignore_external_state=True)


def test_canary_the_ops_listed_as_refusing_symbolic_checkpoints_still_do_and_batch_does_not():
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    numbers = tf.data.Dataset.range(20)
    refused = {"CacheDatasetV2": numbers.cache(), "UniqueDataset": numbers.unique(),
               "IgnoreErrorsDataset": numbers.ignore_errors(), "WindowDataset": numbers.window(2).flat_map(lambda w: w)}
    for name, dataset in refused.items():
        assert name in compat.SYMBOLIC_REFUSED
        iterator = iter(dataset.with_options(options))
        next(iterator)
        with pytest.raises(tf.errors.UnimplementedError, match="symbolic checkpointing"):
            compat.iterator_state(iterator)
    iterator = iter(numbers.shuffle(8, seed=1).map(lambda v: v * 2).batch(3).prefetch(2).with_options(options))
    next(iterator)
    assert compat.iterator_state(iterator)


def test_canary_a_state_without_a_shuffles_seed_generator_count_restores_another_next_pass():
    """Why "pass start" pipelines keep a state inside a pass only when it holds every shuffle's
    seed-generator count (compat/tf_data_state.py): near a pass's end the second shuffle has
    dropped the first one's iterator, the state keeps no count of its generator, and a new
    pipeline (a new process) restored there shuffles the next pass otherwise. The day this test
    fails, TensorFlow restores such states right and `shuffle_counts_kept` can go."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # no thread reading ahead: the same states each run

    def stream():
        return tf.data.Dataset.range(12).shuffle(12, seed=1).shuffle(4, seed=2).batch(2).repeat().with_options(options)

    iterator, states, batches = iter(stream()), [], []
    for _ in range(12):
        states.append(compat.iterator_state(iterator))
        batches.append(next(iterator).numpy().tolist())
    kept, right = [], []
    for at in range(6):
        resumed = iter(stream())
        compat.restore_iterator_state(resumed, states[at])
        kept.append(compat.shuffle_counts_kept(states[at]))
        right.append([next(resumed).numpy().tolist() for _ in range(6)] == batches[at:at + 6])
    assert kept == [1, 2, 2, 2, 2, 1]  # the first shuffle opened at the first batch, dropped for the last
    assert right == [True, True, True, True, True, False]  # at 0 the new pipeline's count happens to agree


def test_canary_a_datasets_graph_ends_in_the_node_dataset_output_names():
    graph = compat.dataset_graph(tf.data.Dataset.range(6).batch(2).prefetch(1))
    nodes = {node.name: node.op for node in graph.node}
    assert nodes[compat.dataset_output(graph)] == "PrefetchDataset"


def test_canary_keras_fit_steps_through_kerasdists_stream_one_pull_per_step_and_its_peek_comes_back():
    """`keras_stream`: fit (under a strategy, so it peeks to build) takes the adapter, pulls one
    batch just before each step, and the batch it peeked at is the first one trained."""
    from kerasdist.compat.keras_data import keras_takes_streams

    assert keras_takes_streams()
    pulled, trained = [], []
    batches = iter(range(100))

    def next_batch():
        pulled.append(next(batches))
        return tf.fill([2, 1], float(pulled[-1])), tf.zeros([2, 1])

    class Seen(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            trained.append(len(pulled))

    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    with compat.fit_unrouted():
        model.fit(compat.keras_stream(next_batch, None), epochs=2, steps_per_epoch=3, verbose=0,
                  callbacks=[Seen()])
    assert pulled == [0, 1, 2, 3, 4, 5]  # the peek's batch 0 was trained first: 6 steps, 6 pulls
    assert trained == [1, 1, 2, 3, 4, 5]  # before each step, only the batches of the steps before (and the peek)


# --------------------------------------------------------------------------------------------
# #59: the step times' all-reduce clock (`compat.tf_collectives`) and the coordination store
# (`compat.tf_distribute.coordination_store`)


def test_tensorflows_own_clock_still_refuses_to_run_under_op_determinism():
    """Why the all-reduces are timed with Python's clock (tf.numpy_function) and not tf.timestamp:
    bitwise resumes need op determinism, under which TensorFlow refuses to run a Timestamp op."""
    from conftest import run_python

    done = run_python("""
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        try:
            tf.function(lambda: tf.timestamp())()
            print("ran")
        except tf.errors.FailedPreconditionError as error:
            print("refused:", str(error).splitlines()[0])
        """)
    assert "refused:" in done.stdout and "Timestamp cannot be called when determinism is enabled" in done.stdout, \
        done.stderr[-2000:]


def test_every_multi_worker_all_reduce_still_goes_through_the_launcher_the_step_times_time():
    """MultiWorkerMirroredStrategy (one process, 2 CPU devices: its collectives are the same ops)
    reduces through CollectiveReplicaLauncher.all_reduce, in which `time_collectives` times the
    sampled steps only; the clock runs under op determinism, and 2 local replicas do not wait on
    each other's timing (a stateful clock made them deadlock)."""
    from conftest import run_python

    done = run_python("""
        import kerasdist
        kerasdist.simulate_devices(2)
        import tensorflow as tf
        from kerasdist import compat
        tf.config.experimental.enable_op_determinism()
        strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
        waits = compat.CollectiveWaits()
        assert compat.time_collectives(waits)

        @tf.function
        def step():
            per_replica = strategy.run(lambda: tf.constant(1.0))
            return strategy.reduce("SUM", per_replica, axis=None)

        assert float(step()) == 2.0 and waits.seconds() == 0.0  # not sampled: no clock read
        waits.sample(True)
        assert float(step()) == 2.0
        print("timed", waits.seconds() > 0)
        compat.time_collectives(None)
        """)
    assert "timed True" in done.stdout, done.stderr[-3000:]


def test_the_coordination_service_store_is_still_reached_through_the_eager_contexts_private_methods():
    """`coordination_store` calls these (the two-process behaviour is test_hangs.py's launcher runs,
    where the chief names a worker stuck elsewhere from what that worker stored)."""
    import inspect

    from tensorflow.python.eager import context

    from kerasdist.compat import tf_distribute

    assert compat.version_within(tf.__version__, tf_distribute.COORDINATION_STORE_VERSIONS)
    signatures = {name: list(inspect.signature(getattr(context.Context, name)).parameters)
                  for name in ("set_config_key_value", "get_config_key_value", "delete_config_key_value")}
    assert signatures == {"set_config_key_value": ["self", "key", "value"],
                          "get_config_key_value": ["self", "key", "timeout_in_ms"],
                          "delete_config_key_value": ["self", "key"]}
    assert compat.coordination_store() is None  # no cluster here: no service, and no store


def test_the_keras_methods_kerasdist_replaces_keep_their_signatures():
    """`import kerasdist` routes `Model.fit` (compat.route_fit) and, on Keras 3.0-3.15, wraps the
    optimizers' `add_variable`: help(), IDEs and reticulate's completion still see Keras's keywords."""
    import inspect

    import kerasdist  # noqa: F401  (the import puts both in place)

    fit = inspect.signature(keras.Model.fit).parameters
    assert list(fit)[:5] == ["self", "x", "y", "batch_size", "epochs"]
    assert {"callbacks", "validation_data", "initial_epoch", "steps_per_epoch"} <= set(fit)
    add_variable = inspect.signature(keras.optimizers.SGD.add_variable).parameters
    assert list(add_variable)[:3] == ["self", "shape", "initializer"]
