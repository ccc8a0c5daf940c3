"""Trains on the data users bring (tests/cases/user_data.json's kinds), under 2 CPU replicas, with
every trainer; test_user_data.py compares uninterrupted and resumed runs.

usage: train_user_data.py JOB [--then JOB ...], a JOB: TRAINER ROOT KIND[,KIND...]
       [--kill-at STEP | --sigterm-at STEP] [--per-worker-dir] [--kill-task TASK]

The jobs run one after the other in this one process (a process costs TensorFlow's set-up and the
strategy's), each printing "done ROOT" when it ends.

Each kind trains in ROOT/KIND (its checkpoints, every 4 steps, all kept) and writes
ROOT/KIND/result.npz (the weights, the loss history) and ROOT/KIND/warnings.json (the messages
of the InputWarnings raised). --kill-at SIGKILLs the process after that optimizer step's
checkpoint is written (its job's first kind's run: the job to run last); --sigterm-at sends it
SIGTERM at that step end of every kind's run of its job (a preemption: that step saved, fit ends
with PreemptedExit, exit status 75, which this script notes in ROOT/KIND/preempted and goes on
with the next kind).

Under the launcher (TF_CONFIG set: the strategy is multi-worker, one CPU replica a worker), the
chief writes result.npz and each other worker result-<task>.npz; --per-worker-dir gives each
worker ROOT/KIND/worker-<index> as its checkpoint directory (hosts that share no disk); --kill-at
then SIGKILLs only --kill-task (e.g. worker:1), on the launcher's first attempt only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path

import kerasdist

if os.environ.get("TF_CONFIG") is None:
    kerasdist.simulate_devices(2)
    STRATEGY = None  # made at first use: mirrored over the 2 devices
else:
    STRATEGY = kerasdist.select_strategy()  # multi-worker: before TensorFlow runs anything

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasdist.checkpoint import background  # noqa: E402
from kerasdist.data.resumable import InputWarning  # noqa: E402

tf.config.experimental.enable_op_determinism()
EPOCHS, EVERY = 3, 4
SAMPLES, FEATURES, BATCH = 96, 4, 16


def samples():
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, FEATURES), dtype=np.float32)
    return x, (x.sum(axis=1) * 1.5).astype(np.int64) % 3


def files(root: Path) -> Path:
    """TFRecord, CSV, image and text files, the same bytes in every process (made once per root)."""
    folder = root / "files"
    if folder.exists():
        return folder
    from PIL import Image

    x, y = samples()
    (folder / "records").mkdir(parents=True)
    for part in range(3):
        rows = range(part * 32, (part + 1) * 32)
        with tf.io.TFRecordWriter(str(folder / "records" / f"part-{part}.tfrecord")) as writer:
            for i in rows:
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[i]]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
        with open(folder / "records" / f"part-{part}.csv", "w") as handle:
            handle.write("a,b,c,d,label\n" + "".join(
                ",".join(f"{v:.6f}" for v in x[i]) + f",{y[i]}\n" for i in rows))
    for i in range(SAMPLES):
        for kind in ("images", "texts"):
            (folder / kind / f"class_{y[i]}").mkdir(parents=True, exist_ok=True)
        pixels = (np.outer(x[i], x[i][::-1])[:, :, None].repeat(3, 2) * 255).astype("uint8")
        Image.fromarray(np.kron(pixels, np.ones((2, 2, 1), "uint8"))).save(folder / "images" / f"class_{y[i]}/{i}.png")
        words = " ".join(f"w{int(v * 10)}" for v in x[i])
        (folder / "texts" / f"class_{y[i]}" / f"{i}.txt").write_text(words)
    return folder


def parse_record(record):
    parsed = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32),
                                                  "y": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], parsed["y"]


def parse_csv(line):
    columns = tf.io.decode_csv(line, [[0.0]] * FEATURES + [[0]])
    return tf.stack(columns[:FEATURES]), tf.cast(columns[FEATURES], tf.int64)


def doubled(x, y):
    return x * 2.0, y


def first_above_tenth(x, y):
    return x[0] > 0.1


def cut_by_label(x, y):
    return x[:1 + tf.cast(y, tf.int32)], y


def csv_rows(name):
    return tf.data.TextLineDataset(name).skip(1)


def jittered(x, y):
    return x + tf.random.uniform([FEATURES], maxval=0.01), y


def text_features(text, label):
    words = tf.strings.split(text)
    return tf.reduce_sum(tf.one_hot(tf.strings.to_hash_bucket_fast(words, FEATURES), FEATURES), axis=0), label


class Shuffled(keras.utils.PyDataset):
    """Batches by index; its order changes at every epoch end (so it depends on the epochs before)."""

    def __init__(self):
        super().__init__()
        self.x, self.y = samples()
        self.order = np.arange(SAMPLES)
        self.rng = np.random.default_rng(11)

    def __len__(self):
        return SAMPLES // BATCH

    def __getitem__(self, index):
        rows = self.order[index * BATCH:(index + 1) * BATCH]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.rng.shuffle(self.order)


def cycling_batches():
    """A generator that yields the same batches every epoch."""
    x, y = samples()
    while True:
        for start in range(0, SAMPLES, BATCH):
            yield x[start:start + BATCH], y[start:start + BATCH]


def dataset(kind: str, root: Path):
    """The data of `kind` (seeded: the global seed is set first, as users do)."""
    keras.utils.set_random_seed(21)
    x, y = samples()
    slices = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "slices-batch":
        return slices.batch(BATCH)
    if kind == "shuffle-reshuffled":
        return slices.shuffle(SAMPLES, seed=1).batch(BATCH)
    if kind == "shuffle-once":
        return slices.shuffle(SAMPLES, seed=1, reshuffle_each_iteration=False).batch(BATCH)
    if kind == "two-shuffles":
        return slices.shuffle(SAMPLES, seed=13).map(doubled).shuffle(24, seed=14).batch(BATCH)
    if kind == "map-filter":
        return slices.map(doubled).filter(first_above_tenth).shuffle(32, seed=2).batch(BATCH)
    if kind == "padded-batch":
        ragged = slices.map(cut_by_label)
        return ragged.shuffle(SAMPLES, seed=3).padded_batch(BATCH, padded_shapes=([FEATURES], []))
    if kind == "guide-cache-prefetch":  # Keras's multi-GPU guide: shuffle, batch, cache, prefetch
        return slices.shuffle(SAMPLES, seed=4).batch(BATCH).cache().prefetch(tf.data.AUTOTUNE)
    if kind == "interleave-tfrecord":
        names = tf.data.Dataset.list_files(str(files(root) / "records" / "*.tfrecord"), shuffle=True, seed=5)
        records = names.interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2, deterministic=True)
        return records.map(parse_record).shuffle(40, seed=6).batch(BATCH).prefetch(2)
    if kind == "interleave-in-order":
        names = tf.data.Dataset.list_files(str(files(root) / "records" / "*.tfrecord"), shuffle=False)
        records = names.interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2, deterministic=True)
        return records.map(parse_record).batch(BATCH).prefetch(2)
    if kind == "interleave-csv":
        names = tf.data.Dataset.list_files(str(files(root) / "records" / "*.csv"), shuffle=True, seed=7)
        lines = names.interleave(csv_rows, cycle_length=3)
        return lines.map(parse_csv).shuffle(40, seed=8).batch(BATCH)
    if kind == "image-directory":
        return keras.utils.image_dataset_from_directory(files(root) / "images", image_size=(8, 8), batch_size=BATCH,
                                                        seed=9, verbose=False)
    if kind == "text-directory":
        texts = keras.utils.text_dataset_from_directory(files(root) / "texts", batch_size=None, seed=10,
                                                        verbose=False)
        return texts.map(text_features).batch(BATCH)
    if kind == "timeseries":
        return keras.utils.timeseries_dataset_from_array(x, y[FEATURES - 1:], sequence_length=FEATURES,
                                                         batch_size=BATCH, shuffle=True, seed=12)
    if kind == "py-dataset":
        return Shuffled()
    if kind == "python-generator":
        return cycling_batches()
    if kind == "from-generator":
        signature = (tf.TensorSpec([None, FEATURES], tf.float32), tf.TensorSpec([None], tf.int64))
        return tf.data.Dataset.from_generator(lambda: ((a, b) for a, b in zip(
            np.split(x, SAMPLES // BATCH), np.split(y, SAMPLES // BATCH), strict=True)), output_signature=signature)
    if kind == "stateful-random-map":
        return slices.map(jittered).batch(BATCH)
    raise SystemExit(f"unknown kind {kind}")


def input_shape(kind: str):
    return {"image-directory": (8, 8, 3), "timeseries": (FEATURES, FEATURES)}.get(kind, (FEATURES,))


def build(kind: str):
    def build_model():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input(input_shape(kind)), keras.layers.Flatten(), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model
    return build_model


class Interrupt(keras.callbacks.Callback):
    """SIGKILL (or SIGTERM) this process once optimizer step `at` is done and its checkpoint written."""

    def __init__(self, at: int, sig: int):
        super().__init__()
        self.at, self.sig = at, sig

    def on_train_batch_end(self, batch, logs=None):
        if self.at is not None and int(self.model.optimizer.iterations.numpy()) == self.at:
            if self.sig == signal.SIGKILL:
                background.wait_for_all()
            os.kill(os.getpid(), self.sig)


def task() -> str | None:
    return kerasdist.run_context().task


def train(trainer: str, kind: str, folder: Path, root: Path, interrupt: list) -> keras.callbacks.History:
    data = dataset(kind, root)
    steps = {"python-generator": SAMPLES // BATCH}.get(kind)
    if trainer == "distributed_fit":
        return kerasdist.distributed_fit(build(kind), data, epochs=EPOCHS, checkpoint_dir=folder, every_steps=EVERY,
                                         keep=100, callbacks=interrupt, verbose=0, steps_per_epoch=steps,
                                         strategy=STRATEGY or "auto")
    strategy = STRATEGY or kerasdist.select_strategy()
    if trainer == "custom_fit":
        return kerasdist.custom_fit(build(kind), data, epochs=EPOCHS, checkpoint_dir=folder, strategy=strategy,
                                    every_steps=EVERY, keep=100, callbacks=interrupt, verbose=0,
                                    steps_per_epoch=steps)
    with strategy.scope():
        model = kerasdist.make_or_restore_model(folder, build(kind))
    checkpoint = kerasdist.checkpoint_callback(folder, every_steps=EVERY, keep=100)
    if trainer == "resume_fit":
        return kerasdist.resume_fit(model, data, EPOCHS, checkpoint, callbacks=interrupt, verbose=0,
                                    steps_per_epoch=steps)
    assert trainer == "fit"
    return model.fit(data, epochs=EPOCHS, callbacks=[*interrupt, checkpoint], verbose=0, steps_per_epoch=steps)


def main(argv: list[str]) -> None:
    while "--then" in argv:
        run_job(argv[:argv.index("--then")])
        argv = argv[argv.index("--then") + 1:]
    run_job(argv)


def run_job(argv: list[str]) -> None:
    trainer, root, kinds = argv[0], Path(argv[1]), argv[2].split(",")
    interrupt = []
    if "--kill-at" in argv:
        first_attempt = os.environ.get("KERASDIST_RESTART", "0") == "0"
        victim = argv[argv.index("--kill-task") + 1] if "--kill-task" in argv else None
        chosen = first_attempt and victim in (None, task())
        interrupt = [Interrupt(int(argv[argv.index("--kill-at") + 1]) if chosen else None, signal.SIGKILL)]
    if "--sigterm-at" in argv:
        interrupt = [Interrupt(int(argv[argv.index("--sigterm-at") + 1]), signal.SIGTERM)]
    for kind in kinds:
        folder = root / kind
        if "--per-worker-dir" in argv:
            folder = folder / f"worker-{kerasdist.run_context().task_index or 0}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", InputWarning)
            try:
                history = train(trainer, kind, folder, root, interrupt)
            except kerasdist.PreemptedExit as preempted:
                (folder / "preempted").write_text(str(preempted.code))
                continue
        said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        name = "result" if kerasdist.run_context().is_chief else f"result-{task().replace(':', '-')}"
        (out / f"{name}.warnings.json" if name != "result" else out / "warnings.json").write_text(json.dumps(said))
        np.savez(out / f"{name}.npz", *history.model.get_weights(), loss=np.array(history.history["loss"]))
    print("done", root, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
