"""What distributed_fit costs over the same training written by hand, tutorial style.

Both variants train the same small CNN (8x8x1 -> Conv 32 -> Conv 32 -> Dense 64 -> 10, Adam) on
the same synthetic data (16384 samples, global batch 128, as many epochs as make a hand-written
call last about 30 s, `--seconds`), from scratch, under a
MirroredStrategy over 2 simulated CPU devices, saving a checkpoint at every epoch end:

- distributed_fit: kerasdist.distributed_fit(build_model, x, y, strategy=<mirrored>, batch_size=128,
  epochs=E, checkpoint_dir=<fresh empty directory>, seed=0): make_dataset (reshuffled each epoch),
  crash-safe checkpoints (keep=3), resume logic.
- hand-written: `with strategy.scope(): model = build_model()`, then
  `from_tensor_slices((x, y)).shuffle(n, seed=0).batch(128)` (reshuffled each epoch, as
  distributed_fit does) and `model.fit(data, epochs=E, callbacks=[ModelCheckpoint(<fresh>.keras)])`.

One untimed warm-up call of each first (TensorFlow's one-time costs in this process), then the
variants interleaved (distributed_fit, hand-written, ...), each repetition with a fresh model,
the garbage collector run before each timed call and off during it (as timeit does).
Figures: total steps / wall time of the whole call, distributed_fit over hand-written (what a
user waits for), and the same over the epochs after the first (steady state, from epoch end
times). Prints one JSON line and writes bench/results/overhead.json.

usage: .venv/bin/python bench/bench_overhead.py [--repeats 3] [--seconds 30 | --epochs E] [--samples 16384]
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402

kerasdist.simulate_devices(2)  # before TensorFlow initialises its devices

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import _training as bench  # noqa: E402
from _common import write_result  # noqa: E402


def build_model() -> keras.Model:
    return bench.tutorial_cnn()


def with_distributed_fit(strategy, x, y):
    def run(epochs: int, checkpoint_dir: str) -> list[float]:
        return bench.epoch_ends(lambda callbacks: kerasdist.distributed_fit(
            build_model, x, y, epochs=epochs, checkpoint_dir=checkpoint_dir, strategy=strategy,
            batch_size=bench.BATCH, seed=0, callbacks=callbacks, verbose=0))
    return run


def hand_written(strategy, x, y):
    def run(epochs: int, checkpoint_dir: str) -> list[float]:
        with strategy.scope():
            model = build_model()
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(bench.BATCH)
        checkpoint = keras.callbacks.ModelCheckpoint(str(Path(checkpoint_dir) / "model.keras"))
        return bench.epoch_ends(lambda timer: model.fit(data, epochs=epochs, callbacks=[checkpoint, *timer], verbose=0))
    return run


def epochs_lasting(seconds: float, variant) -> int:
    """Epochs that make a call of about `seconds`, from a hand-written epoch's time."""
    with tempfile.TemporaryDirectory() as tmp:
        ends = variant(2, tmp)
    return max(2, round(seconds / (ends[1] - ends[0])))


def main() -> None:
    arguments = bench.parser(epochs=0, samples=16384)
    arguments.add_argument("--seconds", type=float, default=30.0,
                           help="length of a timed call when --epochs is 0 (from a hand-written epoch's time)")
    args = arguments.parse_args()
    if args.epochs:  # 0: as many as make a call of --seconds
        bench.check_epochs(arguments, args.epochs)
    x, y = bench.synthetic_digits(args.samples)
    strategy = kerasdist.select_strategy("mirrored")
    steps = -(-args.samples // bench.BATCH)
    variants = {"distributed_fit": with_distributed_fit(strategy, x, y), "hand_written": hand_written(strategy, x, y)}
    args.epochs = args.epochs or epochs_lasting(args.seconds, variants["hand_written"])
    whole, steady = bench.interleaved(variants, args.repeats, args.epochs, steps, warm_up_epochs=1)

    figures = bench.whole_and_steady_figures(
        "wrapper", whole, steady, "distributed_fit", "hand_written", ">= 1.0",
        f"{args.epochs} epochs (about {args.seconds:.0f} s), distributed_fit over hand-written: "
        "the pipeline should win")
    write_result(
        "overhead", figures,
        strategy=f"MirroredStrategy over {strategy.num_replicas_in_sync} simulated CPU devices",
        model=f"Conv2D 32 x2 + Dense 64 + Dense 10 on 8x8x1, Adam, {build_model().count_params()} parameters",
        samples=args.samples, batch_size=bench.BATCH, epochs=args.epochs, steps_per_call=steps * args.epochs,
        repeats=args.repeats,
        order="warm-up of each once, then distributed_fit, hand_written, ... interleaved, every other round reversed",
        distributed_fit=("kerasdist.distributed_fit(build_model, x, y, strategy=<mirrored>, batch_size=128, "
                         "seed=0, epochs=E, checkpoint_dir=<fresh empty dir>): make_dataset reshuffled "
                         "each epoch, checkpoint every epoch end (keep=3)"),
        hand_written=("with strategy.scope(): build_model(); "
                      "tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(128) "
                      "(reshuffled each epoch, no cache/prefetch); model.fit(data, epochs=E, "
                      "callbacks=[keras.callbacks.ModelCheckpoint(<fresh dir>/model.keras)])"),
    )


if __name__ == "__main__":
    main()
