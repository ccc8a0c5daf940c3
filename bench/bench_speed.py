"""Mixed precision and XLA against plain float32 training on this machine, for information.

Three variants of the same `kerasdist.distributed_fit` call train the same small CNN
(8x8x1 -> Conv 32 -> Conv 32 -> Dense 64 -> 10, Adam; built fresh each time) on the same
synthetic data (8192 samples, global batch 128, 3 epochs, a checkpoint every epoch end) under
the default strategy (one device: the CPU here, the GPU on a GPU machine):

- plain: float32, no XLA;
- mixed_precision: `mixed_precision=True` (`mixed_bfloat16` on a CPU, `mixed_float16` on a GPU);
- jit_compile: `jit_compile=True` (the training step compiled by XLA).

One untimed warm-up call of each first, then the variants interleaved (plain, mixed_precision,
jit_compile, ...), the garbage collector run before each timed call and off during it. Figures
(no target: a CPU without bfloat16 units gains nothing from bfloat16, and XLA's gain depends on
the model): steps/s of each option over plain, over the whole call (compilation included) and
over the epochs after the first (steady state). Prints one JSON line and writes
bench/results/speed.json.

usage: .venv/bin/python bench/bench_speed.py [--repeats 3] [--epochs 3] [--samples 8192]
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import _training as bench  # noqa: E402
import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402

OPTIONS = {"plain": {}, "mixed_precision": {"mixed_precision": True}, "jit_compile": {"jit_compile": True}}


def build_model() -> keras.Model:
    return bench.tutorial_cnn(float32_output=True)


def variant(options, x, y):
    def run(epochs: int, checkpoint_dir: str) -> list[float]:
        return bench.epoch_ends(lambda callbacks: kerasdist.distributed_fit(
            build_model, x, y, epochs=epochs, checkpoint_dir=checkpoint_dir, strategy="default",
            batch_size=bench.BATCH, seed=0, callbacks=callbacks, verbose=0, **options))
    return run


def main() -> None:
    arguments = bench.parser(epochs=3, samples=8192)
    args, x, y, steps = bench.arguments_and_data(arguments)
    variants = {name: variant(options, x, y) for name, options in OPTIONS.items()}
    whole, steady = bench.interleaved(variants, args.repeats, args.epochs, steps)

    figures = []
    for option in ("mixed_precision", "jit_compile"):
        for label, rates, what in (("", whole, "the whole call (compilation included)"),
                                   ("_steady", steady, "the epochs after the first")):
            figures.append(figure(
                f"{option}{label}_steps_per_s_ratio", bench.ratios(rates, option, "plain"), None,
                f"steps/s over {what}, distributed_fit with {option}=True over plain float32",
                steps_per_s=bench.medians(rates, ("plain", option)),
            ))
    write_result(
        "speed", figures,
        strategy="default (one device)", policy_of_mixed_precision=kerasdist.training.speed.precision_policy_name(),
        **bench.run_details(build_model(), args, steps, "plain, mixed_precision, jit_compile"),
    )


if __name__ == "__main__":
    main()
