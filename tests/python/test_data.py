"""make_dataset from every source, its order guarantees, sharding, and 2 simulated devices."""

from __future__ import annotations

import json
import re
import warnings

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

import kerasdist
from conftest import run_python


def labels(dataset, index=1):
    """The label (sample id) of every element, batch by batch, as one flat list."""
    return [v for batch in dataset for v in np.asarray(batch[index]).reshape(-1).tolist()]


def ids_dataset(n=10, **kwargs):
    x = np.arange(n * 2, dtype="float32").reshape(n, 2)
    return kerasdist.make_dataset(x, np.arange(n), **kwargs)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """3 CSV and 3 TFRecord files of 5 records each; the label is the record's global id."""
    root = tmp_path_factory.mktemp("files")
    for f in range(3):
        with open(root / f"part{f}.csv", "w") as handle:
            handle.write("a,b,label\n")
            handle.writelines(f"{f * 5 + r},{r / 10},{f * 5 + r}\n" for r in range(5))
        with tf.io.TFRecordWriter(str(root / f"part{f}.tfrecord")) as writer:
            for r in range(5):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[f * 5 + r, r, 1])),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=[f * 5 + r])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return root


# --- order: a pure function of (seed, epoch) -------------------------------------------------

def test_same_seed_same_order_and_epochs_differ():
    a = labels(ids_dataset(batch_size=4, seed=7, epochs=3))
    b = labels(ids_dataset(batch_size=4, seed=7, epochs=3))
    assert a == b
    epochs = [a[0:10], a[10:20], a[20:30]]
    assert all(sorted(e) == list(range(10)) for e in epochs)  # each epoch is a permutation
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[0] == kerasdist.epoch_order(10, 7, 0).tolist()
    assert labels(ids_dataset(batch_size=4, seed=8, epochs=1)) != epochs[0]


def test_order_ignores_the_global_seed_and_the_process():
    code = """
        import json, sys, numpy as np, tensorflow as tf, kerasdist
        tf.random.set_seed(int(sys.argv[1]))
        ds = kerasdist.make_dataset(np.zeros((10, 1)), np.arange(10), batch_size=4, seed=7, epochs=2)
        print(json.dumps([v for b in ds for v in b[1].numpy().tolist()]))
    """
    runs = [run_python(code, str(global_seed)) for global_seed in (1, 99)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    orders = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert orders[0] == orders[1] == labels(ids_dataset(batch_size=4, seed=7, epochs=2))


@pytest.mark.parametrize("epoch,skip", [(0, 1), (1, 0), (1, 2), (2, 1)])
def test_resume_is_the_tail_of_the_uninterrupted_stream(epoch, skip):
    full = [b[1].numpy().tolist() for b in ids_dataset(batch_size=4, seed=5, epochs=4)]
    steps = 3
    resumed = ids_dataset(batch_size=4, seed=5, initial_epoch=epoch, skip_batches=skip, epochs=4)
    assert [b[1].numpy().tolist() for b in resumed] == full[epoch * steps + skip:]
    assert kerasdist.dataset_info(resumed).num_batches == len(full) - epoch * steps - skip


def test_endless_stream_runs_epochs_in_order():
    stream = ids_dataset(batch_size=5, seed=2, initial_epoch=3, repeat=True).take(6)
    expected = [kerasdist.epoch_order(10, 2, e).tolist() for e in (3, 4, 5)]
    assert labels(stream) == [i for order in expected for i in order]


def test_fit_resumed_mid_epoch_ends_with_the_same_weights():
    import keras

    x = np.linspace(-1, 1, 30, dtype="float32").reshape(10, 3)
    y = x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    start = model.get_weights()

    def trained(*parts):
        model.set_weights(start)
        for kwargs, fit_kwargs in parts:
            ds = kerasdist.make_dataset(x, y, batch_size=4, seed=6, **kwargs)
            model.fit(ds, verbose=0, shuffle=False, **fit_kwargs)
        return np.concatenate([w.ravel() for w in model.get_weights()])

    steps = 3
    whole = trained(({}, {"epochs": 2, "steps_per_epoch": steps}))
    resumed = trained(
        ({"epochs": 1}, {"epochs": 1, "steps_per_epoch": 1}),  # stopped after 1 batch of epoch 0
        ({"skip_batches": 1, "epochs": 1}, {"epochs": 1, "steps_per_epoch": steps - 1}),
        ({"initial_epoch": 1}, {"initial_epoch": 1, "epochs": 2, "steps_per_epoch": steps}),
    )
    not_skipped = trained(
        ({"epochs": 1}, {"epochs": 1, "steps_per_epoch": 1}),
        ({"epochs": 1}, {"epochs": 1, "steps_per_epoch": steps - 1}),  # replays batch 0
        ({"initial_epoch": 1}, {"initial_epoch": 1, "epochs": 2, "steps_per_epoch": steps}),
    )
    assert np.array_equal(whole, resumed)
    assert not np.array_equal(whole, not_skipped)


# --- sources ---------------------------------------------------------------------------------

def test_multi_input_dict_list_and_sample_weight():
    a, b = np.ones((6, 2)), np.zeros((6, 3))
    (x, y, w), = kerasdist.make_dataset({"a": a, "b": b}, np.arange(6), sample_weight=np.full(6, 0.5),
                                         batch_size=6, epochs=1)
    assert set(x) == {"a", "b"} and x["b"].shape == (6, 3) and x["a"].dtype == tf.float32
    assert w.numpy().tolist() == [0.5] * 6
    (inputs,), = kerasdist.make_dataset([a, b], batch_size=6, epochs=1, shuffle=False)
    assert [t.shape.as_list() for t in inputs] == [[6, 2], [6, 3]]


def test_data_frame_and_series():
    frame = pd.DataFrame({"a": [1, 2, 3, 4], "b": [0.5, 1.0, 1.5, 2.0], "t": [0, 1, 0, 1]})
    (x, y), = kerasdist.make_dataset(frame, "t", batch_size=4, shuffle=False, epochs=1)
    assert x.numpy().tolist() == [[1, 0.5], [2, 1.0], [3, 1.5], [4, 2.0]]
    assert y.numpy().tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="non-numeric columns: c"):
        kerasdist.make_dataset(frame.assign(c=pd.Categorical(["u", "v", "u", "v"])))


def test_existing_dataset_source_is_block_shuffled_and_cached():
    source = tf.data.Dataset.range(10).map(lambda i: (tf.cast(i, tf.float32)[None], i))
    ds = kerasdist.make_dataset(source, batch_size=5, seed=1, shuffle_buffer=5, epochs=2, cache=True)
    seen = labels(ds)
    assert sorted(seen[:10]) == list(range(10)) and seen[:10] != list(range(10))
    assert sorted(seen[:5]) == list(range(5))  # blocks of shuffle_buffer stay together
    assert seen[:10] != seen[10:]  # each pass is shuffled differently
    assert seen == labels(kerasdist.make_dataset(source, batch_size=5, seed=1, shuffle_buffer=5, epochs=2))
    assert kerasdist.dataset_info(ds).source == "dataset"


@pytest.mark.parametrize("pattern,kwargs", [
    ("*.csv", {"label_column": "label"}),
    ("*.tfrecord", {"label_column": "y", "features": {"x": [3], "y": []}}),
])
def test_file_sources(files, pattern, kwargs):
    ds = kerasdist.make_dataset(str(files / pattern), batch_size=5, seed=3, epochs=3, **kwargs)
    info = kerasdist.dataset_info(ds)
    assert (info.source, info.num_samples, info.steps_per_epoch, info.shard_policy) == ("files", 15, 3, "FILE")
    seen = [int(v) for v in labels(ds)]
    epochs = [seen[0:15], seen[15:30], seen[30:45]]
    assert all(sorted(e) == list(range(15)) for e in epochs) and epochs[0] != epochs[1]
    again = kerasdist.make_dataset(str(files / pattern), batch_size=5, seed=3, epochs=3, **kwargs)
    assert seen == [int(v) for v in labels(again)]
    resumed = kerasdist.make_dataset(str(files / pattern), batch_size=5, seed=3, initial_epoch=1,
                                     skip_batches=1, epochs=3, **kwargs)
    assert [int(v) for v in labels(resumed)] == seen[20:]
    first = next(iter(kerasdist.make_dataset(str(files / pattern), batch_size=5, shuffle=False, epochs=1, **kwargs)))
    assert first[0].shape[1] == (2 if pattern == "*.csv" else 3)


def test_file_cache_on_disk(files, tmp_path):
    ds = kerasdist.make_dataset(str(files / "*.csv"), label_column="label", batch_size=5, seed=3,
                                epochs=2, cache=str(tmp_path / "cache"))
    seen = labels(ds)
    assert sorted(seen[:15]) == list(range(15))
    assert any(p.name.startswith("cache") for p in tmp_path.iterdir())


def test_file_errors(files):
    with pytest.raises(ValueError, match="label_column 'nope' is not a column"):
        kerasdist.make_dataset(str(files / "*.csv"), label_column="nope")
    with pytest.raises(ValueError, match="features: TFRecord files need"):
        kerasdist.make_dataset(str(files / "*.tfrecord"))
    with pytest.raises(ValueError, match="validation_split needs in-memory data"):
        kerasdist.make_dataset_split(str(files / "*.csv"), validation_split=0.2)


# --- options, transforms, validation ---------------------------------------------------------

def test_options_and_map_fn_in_parallel_keep_order():
    ds = ids_dataset(batch_size=4, seed=1, epochs=1, map_fn=lambda x, y: (x * 2, y + 100))
    options = ds.options()
    assert options.deterministic is True
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA
    assert labels(ds) == [i + 100 for i in kerasdist.epoch_order(10, 1, 0)]
    x, y = next(iter(ds))
    assert np.allclose(x.numpy()[:, 0], (y.numpy() - 100) * 4)  # x[:, 0] = 2 * id, doubled


def test_validation_split_never_overlaps_training():
    x = np.arange(40, dtype="float32").reshape(20, 2)
    split = kerasdist.make_dataset_split(x, np.arange(20), validation_split=0.25, batch_size=3, seed=9, epochs=5)
    assert isinstance(split, kerasdist.DatasetSplit)
    train, validation = split  # unpacks as a pair; split.train and split.validation name them
    assert train is split.train and validation is split.validation
    seen, held = set(labels(train)), labels(validation)
    assert held == [15, 16, 17, 18, 19]
    assert seen == set(range(15)) and not seen & set(held)
    info = kerasdist.dataset_info(validation)
    assert (info.role, info.num_samples, info.steps_per_epoch) == ("validation", 5, 2)
    assert kerasdist.dataset_info(train).validation_samples == 5
    # make_dataset always returns one dataset: no validation_split there
    with pytest.raises(TypeError, match="validation_split"):
        kerasdist.make_dataset(x, np.arange(20), validation_split=0.25)
    with pytest.raises(ValueError, match="validation_split must be a fraction"):
        kerasdist.make_dataset_split(x, validation_split=None)


def test_check_finite_also_catches_inf_in_other_inputs():
    bad = np.ones((4, 2))
    bad[2, 0] = np.inf
    with pytest.raises(ValueError, match="sample 2 of input 1"):
        kerasdist.make_dataset([np.ones((4, 1)), bad], check_finite=True)
    kerasdist.make_dataset([np.ones((4, 1)), bad])  # not asked: accepted


def test_dataset_info_refuses_other_datasets():
    with pytest.raises(ValueError, match="was not made by make_dataset"):
        kerasdist.dataset_info(tf.data.Dataset.range(3))


# --- the finite default: one epoch per pass (issue #12) --------------------------------------

def test_default_is_one_epoch_and_each_pass_is_the_next_epoch():
    ds = ids_dataset(n=10, batch_size=4, seed=7, initial_epoch=2)
    assert int(ds.cardinality()) == 3 and kerasdist.dataset_info(ds).form == "one_epoch"
    next(iter(ds))  # a pass abandoned early is not an epoch
    passes = [labels(ds) for _ in range(3)]
    assert passes == [kerasdist.epoch_order(10, 7, e).tolist() for e in (2, 3, 4)]
    again = ids_dataset(n=10, batch_size=4, seed=7, initial_epoch=2)  # a new process or a restart
    assert labels(again) == passes[0]


def test_fit_on_the_default_runs_each_epoch_once_without_warnings():
    x = np.arange(20, dtype="float32").reshape(10, 2)
    ds = kerasdist.make_dataset(x, np.arange(10, dtype="float32"), batch_size=4, seed=1)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(ds, epochs=2, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert labels(ds) == kerasdist.epoch_order(10, 1, 2).tolist()  # fit read epochs 0 and 1


def test_forms_are_checked():
    with pytest.raises(ValueError, match="skip_batches .* needs the stream form"):
        ids_dataset(batch_size=4, skip_batches=1)
    with pytest.raises(ValueError, match="repeat=True and epochs=3"):
        ids_dataset(batch_size=4, repeat=True, epochs=3)
    assert kerasdist.plan_dataset(np.zeros((10, 1)), batch_size=4).steps_per_epoch == 3
    held_out = kerasdist.plan_dataset(np.zeros((10, 1)), batch_size=4, validation_split=0.2)  # the training part
    assert (held_out.validation_samples, held_out.num_samples, held_out.steps_per_epoch) == (2, 8, 2)


@pytest.mark.parametrize(("args", "message"), [
    (dict(shuffle=1), "shuffle must be True or False, got 1."),
    (dict(drop_remainder="yes"), "drop_remainder must be True or False, got 'yes'."),
    (dict(per_worker=None), "per_worker must be True or False, got None."),
    (dict(file_format="parquet"), "file_format must be 'tfrecord' or 'csv', got 'parquet'."),
    (dict(epochs=0), "epochs must be an integer >= 1 or None, got 0."),
    (dict(seed=1.0), "seed must be an integer, got 1.0."),
])
def test_dataset_options_are_refused_when_the_record_is_made_naming_the_argument(args, message):
    from kerasdist.data import DatasetOptions

    with pytest.raises(ValueError, match=re.escape(message)):
        DatasetOptions(**args)
    with pytest.raises(ValueError, match=re.escape(message)):  # before x is looked at
        kerasdist.make_dataset(object(), **args)


def test_dataset_options_hold_plain_python_values_that_the_plan_and_its_info_read():
    from kerasdist.data import DatasetOptions, planned_dataset

    options = DatasetOptions(seed=np.int64(3), batch_size=np.int32(4), epochs=np.int64(2))
    assert (type(options.seed), type(options.batch_size), type(options.epochs)) == (int, int, int)
    with pytest.raises(TypeError, match="make_dataset\\(\\) got unexpected arguments: bogus"):
        options.replaced(bogus=1)
    planned = planned_dataset(np.zeros((10, 1)), seed=np.int64(3), batch_size=4, epochs=2)
    assert planned.plan.options is planned.options
    assert (planned.info.seed, planned.info.epochs, planned.info.form) == (3, 2, "epochs")


# --- 2 simulated devices (fresh process) -----------------------------------------------------

def test_two_devices_global_per_replica_and_per_worker():
    result = run_python(
        """
        import json, numpy as np, keras, kerasdist
        kerasdist.simulate_devices(2)
        strategy = kerasdist.select_strategy()
        x = np.arange(24, dtype="float32").reshape(12, 2); y = np.arange(12, dtype="float32")
        out = {}
        for name, kw in [("global", {"batch_size": 4}), ("per_replica", {"per_replica_batch_size": 4})]:
            ds = kerasdist.make_dataset(x, y, strategy=strategy, shuffle=False, epochs=1, **kw)
            info = kerasdist.dataset_info(ds)
            out[name] = [info.batch_size, info.per_replica_batch_size, info.num_replicas, info.sizing,
                         info.steps_per_epoch, [int(b[1].shape[0]) for b in ds]]
            dist = strategy.experimental_distribute_dataset(ds)
            out[name + "_replicas"] = [[v.numpy().tolist() for v in b[1].values] for b in dist]
        pw = kerasdist.make_dataset(x, y, batch_size=4, strategy=strategy, shuffle=False, epochs=1, per_worker=True)
        out["per_worker"] = [[v.numpy().tolist() for v in b[1].values] for b in pw]
        out["per_worker_policy"] = kerasdist.dataset_info(pw).shard_policy
        try:
            kerasdist.make_dataset(x, y, batch_size=5, strategy=strategy, per_worker=True)
        except ValueError as e:
            out["uneven"] = str(e)
        with strategy.scope():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        ds = kerasdist.make_dataset(x, y, per_replica_batch_size=2, strategy=strategy, seed=1, repeat=True)
        model.fit(ds, epochs=2, steps_per_epoch=kerasdist.dataset_info(ds).steps_per_epoch, verbose=0)
        out["steps"] = int(model.optimizer.iterations.numpy())
        # Keras peeks at a batch under a strategy, and tf.distribute prefetches ~2 batches: on
        # epochs of more than a few batches neither counts as a pass.
        x40 = np.arange(80, dtype="float32").reshape(40, 2); y40 = np.arange(40, dtype="float32")
        one = kerasdist.make_dataset(x40, y40, per_replica_batch_size=2, strategy=strategy, seed=1)
        model.fit(one, epochs=2, verbose=0)
        out["one_epoch_steps"] = int(model.optimizer.iterations.numpy()) - out["steps"]
        out["next_pass"] = [int(v) for b in one for v in b[1].numpy()]
        out["epoch2"] = kerasdist.epoch_order(40, 1, 2).tolist()
        print(json.dumps(out))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["global"][:5] == [4, 2, 2, "batch_size", 3] and out["global"][5] == [4, 4, 4]
    assert out["per_replica"][:5] == [8, 4, 2, "per_replica_batch_size", 2] and out["per_replica"][5] == [8, 4]
    assert out["global_replicas"][0] == [[0.0, 1.0], [2.0, 3.0]]
    assert out["per_replica_replicas"][0] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert out["per_worker"] == out["global_replicas"]  # each replica gets the same share either way
    assert out["per_worker_policy"] == "per_worker"
    assert "batch_size 5 is not divisible by the 2 replicas" in out["uneven"]
    assert out["steps"] == 6
    assert out["one_epoch_steps"] == 20 and out["next_pass"] == out["epoch2"]


@pytest.mark.parametrize("source", ["memory", "files"])
def test_auto_shard_gives_each_worker_a_disjoint_share(files, source):
    """TensorFlow's own auto-shard rewrite, as a 2-worker cluster would apply it."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    if source == "memory":
        ds = ids_dataset(n=15, batch_size=5, seed=3, epochs=1)
    else:
        ds = kerasdist.make_dataset(str(files / "*.csv"), label_column="label", batch_size=5, seed=3, epochs=1)
    policy = ds.options().experimental_distribute.auto_shard_policy
    assert policy == getattr(tf.data.experimental.AutoShardPolicy, "DATA" if source == "memory" else "FILE")
    shares = [labels(_AutoShardDataset(ds, 2, worker)) for worker in range(2)]
    if source == "memory":  # the epoch's batches, dealt out to the workers
        assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(15))
    else:  # whole files dealt out from the stream of file names: epoch 0's order, epoch 1's, ...
        names = np.concatenate([kerasdist.epoch_order(3, 3, e) for e in (0, 1)])
        for worker, share in enumerate(shares):
            assert len(share) == 15  # each worker's own stream of 3 batches
            files_read = sorted(int(v) // 5 for v in share)  # file f holds ids 5f .. 5f+4
            assert files_read == sorted(f for f in names[worker::2] for _ in range(5))


def test_sharding_reads_the_worker_count_from_the_run_context(files):
    """More workers (RunContext.num_workers, the one definition) than files: whole files cannot be
    dealt out, so records are (DATA), and the length is left to tf.data (a share is cut later)."""
    import dataclasses

    from kerasdist.context import run_context

    four_workers = dataclasses.replace(run_context(), kind="multi_worker", num_workers=4)
    ds = kerasdist.make_dataset(str(files / "*.csv"), label_column="label", batch_size=5, epochs=1,
                                strategy=four_workers)
    assert kerasdist.dataset_info(ds).shard_policy == "DATA"
    assert int(ds.cardinality()) < 0
    one = kerasdist.make_dataset(str(files / "*.csv"), label_column="label", batch_size=5, epochs=1)
    assert kerasdist.dataset_info(one).shard_policy == "FILE" and int(one.cardinality()) == 3


def test_finite_pipelines_tell_their_length_so_keras_ends_passes_without_warning():
    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20, dtype=np.float32)
    finite = kerasdist.make_dataset(x, y, batch_size=8, epochs=3, skip_batches=1)
    assert int(finite.cardinality()) == 3 * 3 - 1 == len(list(finite))
    for batch_size in (8, 10):  # with and without a short last batch (10: whole batches, unbatched)
        endless = int(kerasdist.make_dataset(x, y, batch_size=batch_size, repeat=True).cardinality())
        assert endless in (tf.data.INFINITE_CARDINALITY, tf.data.UNKNOWN_CARDINALITY)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns "Your input ran out of data" on unknown lengths
        model.evaluate(kerasdist.make_dataset(x, y, batch_size=8, epochs=1, shuffle=False), verbose=0)


def test_short_one_epoch_dataset_under_several_replicas_warns():
    """tf.distribute's prefetch can read a pass of a few batches that Keras only peeks at (the
    first epoch is then skipped: measured with 2 CPU replicas up to 4 batches), so that case
    warns; longer epochs, one replica and the stream form do not."""
    import warnings

    from kerasdist.context import RunContext

    two = RunContext(strategy=tf.distribute.get_strategy(), kind="mirrored", num_replicas=2)
    x = np.zeros((16, 1), "float32")
    with pytest.warns(kerasdist.data.ShortEpochWarning, match="epoch of 4 batches under 2 replicas"):
        kerasdist.make_dataset(x, batch_size=4, strategy=two)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kerasdist.data.ShortEpochWarning)
        kerasdist.make_dataset(x, batch_size=2, strategy=two)  # 8 batches
        kerasdist.make_dataset(x, batch_size=4, strategy=two, epochs=2)  # the stream form
        kerasdist.make_dataset(x, batch_size=4)  # one replica


@pytest.mark.parametrize("args, count", [
    (dict(drop_remainder=False), 7),  # epochs 1 and 2, one batch skipped: 3 + 4 batches
    (dict(drop_remainder=True), 5),
    (dict(shuffle=False, skip_batches=0), 8),  # in order: the arrays themselves, sliced
    (dict(batch_size=10, skip_batches=0), 10),  # no short batch: static batch shape
    (dict(shuffle=False, skip_batches=0, validation_split=0.2), 6),  # 40 training rows of 50
])
def test_small_data_gathered_per_epoch_gives_the_batches_of_per_batch_gathering(monkeypatch, args, count):
    from kerasdist.data import pipelines

    x = np.arange(50 * 3, dtype="float32").reshape(50, 3)
    args = dict(dict(batch_size=16, seed=3, initial_epoch=1, skip_batches=1, epochs=3), **args)

    def batches():
        make = kerasdist.make_dataset_split if "validation_split" in args else kerasdist.make_dataset
        made = make(x, np.arange(50), **args)
        return [tuple(t.numpy() for t in b) for b in (made.train if "validation_split" in args else made)]

    whole_epochs = batches()
    monkeypatch.setattr(pipelines, "_WHOLE_EPOCH_BYTES", 0)  # every source gathered per batch
    per_batch = batches()
    assert len(whole_epochs) == len(per_batch) == count
    for a, b in zip(whole_epochs, per_batch, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_tf_data_still_runs_grappler_on_each_plain_map_function_but_not_on_kerasdists():
    """The upstream cost compat.map_on_cpu avoids: with Grappler's debug stripper on, a plain
    `Dataset.map` function loses its Assert (Grappler rewrote it when the iterator instantiated
    it), while one built by map_on_cpu keeps it (instantiated without Grappler). Fails once
    upstream stops optimizing tf.data functions: drop the shim then."""
    result = run_python("""
        import tensorflow as tf
        tf.config.optimizer.set_experimental_options({"debug_stripper": True})
        from kerasdist import compat

        def failing(x):
            with tf.control_dependencies([tf.debugging.Assert(tf.equal(x, -1), ["the assert ran"])]):
                return tf.identity(x)

        for name, ds in (("plain", tf.data.Dataset.range(1).map(failing)),
                         ("kerasdist", compat.map_on_cpu(tf.data.Dataset.range(1), failing))):
            try:
                list(ds)
                print(name, "stripped")
            except tf.errors.InvalidArgumentError:
                print(name, "ran")
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["plain stripped", "kerasdist ran"], result.stdout


def _pipeline_functions(dataset):
    """Every function tf.data instantiates for a new iterator of `dataset`."""
    functions = [wrapper.function for wrapper in dataset._functions()]
    return functions + [f for upstream in dataset._inputs() for f in _pipeline_functions(upstream)]


@pytest.mark.parametrize("form", [{"repeat": True}, {}, {"epochs": 3}, {"batch_size": 3}])
def test_every_function_of_an_in_memory_pipeline_skips_grappler(form):
    """make_dataset's in-memory pipelines (the stream, the one-epoch form, a short last batch)
    instantiate only functions marked for their own device, so a new iterator (one per fit call,
    one or two per epoch of the one-epoch form) costs no Grappler pass."""
    kwargs = {"batch_size": 4, "seed": 1, **form}
    dataset = ids_dataset(10, **kwargs)
    functions = _pipeline_functions(dataset)
    assert functions, "the pipeline has its shuffle function"
    unmarked = [f.name for f in functions if not f.function_def.attr["experimental_ints_on_device"].b]
    assert not unmarked


def test_a_marked_function_with_an_int32_result_still_fails_upstream():
    """Why compat.map_on_cpu maps int32-returning functions as usual: under the single-device mark
    their int32 results are _DeviceRetval nodes, and tf.data's inject_prefetch (autotuning on)
    then refuses a function with two results. Fails once upstream accepts them."""
    from kerasdist import compat
    from kerasdist.compat import tf_data

    pair = lambda i: (tf.cast(i, tf.int32), tf.cast(i, tf.int32))  # noqa: E731
    marked = tf_data._marked_function(pair, "Dataset.map()", tf.data.Dataset.range(2))
    dataset = tf_data._SingleDeviceFunctionDataset(tf.data.Dataset.range(2), marked, flat=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected only one fetch node"):
        list(dataset)
    assert [a.numpy().tolist() for a, _ in compat.map_on_cpu(tf.data.Dataset.range(2), pair)] == [0, 1]


@pytest.mark.parametrize("form", [{"repeat": True}, {}, {"epochs": 2}, {"batch_size": 3},
                                  {"map_fn": lambda x, y: (x * 2, y)}])
def test_int32_data_flows_through_every_in_memory_form_even_autotuned(form):
    """R integers arrive as int32: every in-memory pipeline form takes them, also when the
    user turns tf.data's autotuning on, and gives the batches the same data as int64 gives."""
    kwargs = {"batch_size": 4, "seed": 3, "epochs": 1, **form}
    if form.get("repeat"):
        kwargs.pop("epochs")
    tuned = tf.data.Options()
    tuned.autotune.enabled = True

    def first_batches(dtype):
        x = np.arange(20, dtype=dtype).reshape(10, 2)
        dataset = kerasdist.make_dataset(x, np.arange(10, dtype=dtype), **kwargs).with_options(tuned)
        return [(bx.numpy().tolist(), by.numpy().tolist()) for bx, by in dataset.take(5)]

    assert first_batches(np.int32) == first_batches(np.int64)


# --- a resumed stream starts at the reader's position (#58) ----------------------------------

UNEQUAL_RECORDS = (5, 3, 8, 1, 6, 4, 7)  # 34 records, in files of unequal lengths


@pytest.fixture(scope="module")
def unequal_files(tmp_path_factory):
    """The same records as CSV and TFRecord files of unequal lengths; the label is the record's id."""
    root = tmp_path_factory.mktemp("unequal")
    first = 0
    for f, n in enumerate(UNEQUAL_RECORDS):
        ids = range(first, first + n)
        (root / f"part{f}.csv").write_text("a,label\n" + "".join(f"{i},{i}\n" for i in ids))
        with tf.io.TFRecordWriter(str(root / f"part{f}.tfrecord")) as writer:
            for i in ids:
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[i])),
                           "y": tf.train.Feature(float_list=tf.train.FloatList(value=[i]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        first += n
    return root


@pytest.mark.parametrize("source", ["csv", "tfrecord", "dataset"])
@pytest.mark.parametrize(("shuffle", "cache"), [(True, False), (False, False), (True, True)])
def test_a_stream_resumed_at_any_batch_is_the_tail_of_the_uninterrupted_one(unequal_files, source, shuffle, cache):
    """Every (epoch, batch) a resume can start at, files of unequal lengths (the interleave's
    files then end at different times, so the position is not a whole number of files), and a
    cached source (its first pass, read whole, fills the cache). The data is planned once and
    each resume moved there as a resumed run does (`rebuild`: the source is not read again);
    make_dataset itself resumes one of them the same."""
    from kerasdist.data import planned_dataset

    if source == "dataset":
        x = tf.data.Dataset.range(sum(UNEQUAL_RECORDS)).map(lambda i: (tf.cast(i, tf.float32)[None], i))
        spec = {"shuffle_buffer": 5}
    else:
        x = str(unequal_files / f"*.{source}")
        spec = {"label_column": "label"} if source == "csv" else {"label_column": "y", "features": {"x": [1], "y": []}}
    options = dict(batch_size=4, seed=3, shuffle=shuffle, cache=cache, **spec)
    planned = planned_dataset(x, epochs=4, **options)
    whole = [int(v) for v in labels(planned.build())]
    steps = planned.info.steps_per_epoch  # a stream's batches run on over epoch ends
    for epoch in range(3):
        for skip in range(steps):
            resumed = [int(v) for v in labels(planned.rebuild(initial_epoch=epoch, skip_batches=skip, epochs=4))]
            assert resumed == whole[(epoch * steps + skip) * 4:], (epoch, skip)
    made = kerasdist.make_dataset(x, initial_epoch=1, skip_batches=steps - 1, epochs=4, **options)
    assert [int(v) for v in labels(made)] == whole[(2 * steps - 1) * 4:]


@pytest.mark.parametrize("pipeline", ["_file_pipeline", "_stream_pipeline"])
def test_each_worker_share_resumes_at_its_own_position(unequal_files, pipeline):
    """per_worker's pipelines (names dealt out to 2 or 3 workers, records to 8: more workers than
    files), each resumed at batches across an epoch's end, continue their own share's stream."""
    from dataclasses import replace

    from kerasdist.data import pipelines, planned_dataset

    planned = planned_dataset(str(unequal_files / "*.csv"), label_column="label", batch_size=4, seed=3, epochs=4)
    endless = replace(planned.plan, initial_epoch=0, skip_batches=0, epochs=None)
    build = getattr(pipelines, pipeline)
    for workers in (2, 3, 8):
        for worker in range(workers):
            share = (worker, workers)
            whole = labels(build(planned.source, endless, 2, share=share).take(30))
            for start in (1, 4, 9, 17):
                resumed = build(planned.source, replace(endless, skip_batches=start), 2, share=share)
                assert labels(resumed.take(30 - start)) == whole[start * 2:], (workers, worker, start)


FIRST_BATCH_READS = """
    import json, sys
    from pathlib import Path
    import tensorflow as tf, kerasdist

    root = Path(sys.argv[1])
    for part in range(24):
        with tf.io.TFRecordWriter(str(root / f"part{part}.tfrecord")) as writer:
            for i in range(50):
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[i] * 500))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    def rchar():
        return int(Path("/proc/self/io").read_text().split("rchar:")[1].split()[0])

    def first_batch_read(**options):
        ds = kerasdist.make_dataset(str(root / "*.tfrecord"), features={"x": [500]}, batch_size=50, seed=1,
                                    epochs=3, **options)
        iterator = iter(ds)
        before = rchar()
        next(iterator)
        return rchar() - before

    first_batch_read()  # warm: what a first iterator loads once
    resumed = {"initial_epoch": 2, "skip_batches": 12}
    read = {"fresh": first_batch_read(), "resumed": first_batch_read(**resumed),
            "cached": first_batch_read(**resumed, cache=str(root / "cache"), shuffle=False)}
    print(json.dumps({**read, "file": (root / "part0.tfrecord").stat().st_size}))
"""


@pytest.fixture(scope="module")
def first_batch_reads(tmp_path_factory):
    """Bytes a process reads (/proc/self/io's rchar) to hand out the first batch of a stream of 24
    files of 50 records: from its start ("fresh"), resumed 2.5 epochs in ("resumed"), and resumed
    so with the source cached in a file, unshuffled ("cached": what it reads ahead is then a few
    batches, not whole shuffle blocks); "file": one file's bytes."""
    result = run_python(FIRST_BATCH_READS, str(tmp_path_factory.mktemp("first-batch")))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_resumed_file_stream_does_not_read_the_files_before_its_position(first_batch_reads):
    """Resumed 2.5 epochs in, a stream reads about what one read from its start reads (the files
    the interleave has open, and those it and the prefetch read ahead), not the 60 files before
    its position as well."""
    out = first_batch_reads
    # measured: 3 or 4 files more (the open ones read again); from the stream's start: 60 more
    assert out["resumed"] < out["fresh"] + 20 * out["file"], out


def test_a_resumed_cached_stream_reads_one_pass_not_the_passes_before(first_batch_reads):
    """Resumed 2.5 epochs in, a stream cached in a file reads the pass it resumes in up to its
    position (the rest of the pass after it, to fill the cache), not the two passes before it
    from the cache file as well."""
    out = first_batch_reads
    # a pass is 24 files, the position 12 files into it; read from the stream's start, the first
    # pass from the files and the next one and a half from the cache file: 60 files' worth
    assert 12 * out["file"] < out["cached"] < 40 * out["file"], out


def test_record_counts_are_read_once_and_again_only_for_files_changed(tmp_path):
    """Bytes a process reads (rchar, as above) for make_dataset over 24 files of 50 records:
    counted in a first process; a second (a restart) and a second call there read none of the
    files, until two change (one rewritten longer, one only touched): those are read again."""
    code = """
        import json, os, sys
        from pathlib import Path
        import tensorflow as tf, kerasdist

        root, step = Path(sys.argv[1]), sys.argv[2]

        def write(part, records, folder=root):
            with tf.io.TFRecordWriter(str(folder / f"part{part}.tfrecord")) as writer:
                for i in range(records):
                    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[i] * 500))}
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

        def rchar():
            return int(Path("/proc/self/io").read_text().split("rchar:")[1].split()[0])

        def made(folder):
            before = rchar()
            ds = kerasdist.make_dataset(str(folder / "*.tfrecord"), features={"x": [500]}, batch_size=50)
            return rchar() - before, kerasdist.dataset_info(ds).num_samples

        if step == "first":
            for part in range(24):
                write(part, 50)
        (root / step).mkdir()
        write(0, 1, root / step)
        made(root / step)  # warm: what a first call loads once, and a file counted
        out = {"file": (root / "part0.tfrecord").stat().st_size, "first": made(root), "again": made(root)}
        if step == "restart":
            write(0, 60)
            os.utime(root / "part1.tfrecord")
            out["changed"] = made(root)
            out["changed file"] = (root / "part0.tfrecord").stat().st_size
        print(json.dumps(out))
    """
    env = {"KERASDIST_CACHE_DIR": str(tmp_path / "cache")}
    first, restart = (run_python(code, str(tmp_path), step, env=env) for step in ("first", "restart"))
    assert first.returncode == 0 and restart.returncode == 0, (first.stderr + restart.stderr)[-2000:]
    first, restart = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (first, restart))
    files = 24 * first["file"]
    assert first["first"][0] > files and first["first"][1] == 24 * 50, first
    assert first["again"][0] < first["file"] and first["again"][1] == 24 * 50, first
    assert restart["first"][0] < first["file"] and restart["first"][1] == 24 * 50, restart
    assert restart["again"][0] < first["file"], restart
    read, samples = restart["changed"]
    assert first["file"] + restart["changed file"] < read < 3 * first["file"] and samples == 24 * 50 + 10, restart


def test_resume_fit_on_files_killed_mid_epoch_ends_as_the_uninterrupted_run(tmp_path):
    """make_dataset over TFRecord files of unequal lengths, resume_fit under 2 CPU replicas, a
    real SIGKILL after step 14 (the last checkpoint, step 12, is 2 batches into epoch 1): run
    again, it starts at the reader's position there and ends bit for bit as the run never killed."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "train_file_position.py"

    def run(root, *flags):
        return subprocess.run([sys.executable, str(script), str(root), *flags], capture_output=True, text=True,
                              timeout=600)

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    first = run(whole, "--then", killed, "--kill-at", "14")  # one process: the uninterrupted run, then the killed
    assert (whole / "result.npz").exists(), first.stderr[-2000:]
    assert first.returncode == -9, first.stderr[-2000:]
    state = json.loads((killed / "ckpt" / "ckpt-12" / "state.json").read_text())
    assert (state["epoch"], state["step_in_epoch"]) == (1, 2)
    again = run(killed)
    assert again.returncode == 0, again.stderr[-2000:]
    expected, got = np.load(whole / "result.npz"), np.load(killed / "result.npz")
    assert all(np.array_equal(expected[name], got[name]) for name in expected.files)


def test_a_count_made_by_another_reading_is_not_taken(tmp_path, monkeypatch):
    """A count kept from a reading without check_finite does not spare a check_finite call its
    read: the NaN is still refused when make_dataset is called, before any training."""
    monkeypatch.setenv("KERASDIST_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "data.csv"
    path.write_text("a,b,label\n1.0,2.0,0\nnan,1.0,1\n3.0,4.0,0\n")
    unchecked = kerasdist.make_dataset(str(path), label_column="label", batch_size=1)
    assert kerasdist.dataset_info(unchecked).num_samples == 3
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="NaN"):
        kerasdist.make_dataset(str(path), label_column="label", batch_size=1, check_finite=True)
