"""The data users bring resumes at the next unseen batch (#58): every kind of tests/cases/user_data.json
with every trainer, under 2 CPU replicas, resumed from a checkpoint inside an epoch, from one at an
epoch end and after a SIGTERM, and a real SIGKILL per trainer, each compared bit for bit with the
uninterrupted run (or, for the kinds a checkpoint cannot hold, doing what its warning said).

Two processes a trainer, made once for its 4 tests: the first trains every kind uninterrupted
(saving every 4 steps and keeping them all), then every kind SIGTERMed, then one kind SIGKILLed
(which ends it); what the interruptions left is noted before the second resumes, one after the
other, copies of the uninterrupted checkpoints up to one step (what a kill right after that save
leaves), the SIGTERMed runs and the SIGKILLed one (the same call again).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import CASES_DIR

SCRIPT = Path(__file__).parent / "scripts" / "train_user_data.py"
CASES = json.loads((CASES_DIR / "user_data.json").read_text())
KINDS = {kind["id"]: kind for kind in CASES["kinds"]}
MID_EPOCH, EPOCH_END, PREEMPTED_AT, KILLED_AT = 8, 12, 10, 11  # 6 steps an epoch, a save every 4
KILLED_KIND = {"distributed_fit": "image-directory", "resume_fit": "interleave-tfrecord", "fit": "guide-cache-prefetch",
               "custom_fit": "shuffle-reshuffled"}
STEP_OF = {"mid-epoch": MID_EPOCH, "epoch-end": EPOCH_END}


def kinds_of(trainer: str) -> list[str]:
    return list(KINDS) if trainer == "resume_fit" else CASES["all_trainers"]


def train(*jobs: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """`jobs` ([trainer, root, kinds, flag...] each) trained one after the other by one process."""
    args = [arg for job in jobs for arg in ["--then", *job]][1:]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1200)
    if check and run.returncode != 0:
        raise AssertionError(f"{args} exited {run.returncode}:\n{run.stderr[-4000:]}")
    return run


def job(trainer: str, root: Path, kinds: list[str], *flags: str) -> list[str]:
    return [trainer, str(root), ",".join(kinds), *flags]


def saved_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("ckpt-*"))


def interrupted_then_resumed(trainer: str, folder: Path) -> Path:
    """FOLDER/uninterrupted, /mid-epoch, /epoch-end, /preempted, /killed: see the module's doc;
    FOLDER/left.json: what the SIGTERMed and SIGKILLed runs left, read before the resume."""
    kinds, killed_kind = kinds_of(trainer), KILLED_KIND[trainer]
    first = train(job(trainer, folder / "uninterrupted", kinds),
                  job(trainer, folder / "preempted", kinds, "--sigterm-at", str(PREEMPTED_AT)),
                  job(trainer, folder / "killed", [killed_kind], "--kill-at", str(KILLED_AT)), check=False)
    done = [line.removeprefix("done ") for line in first.stdout.splitlines() if line.startswith("done ")]
    if done[:2] != [str(folder / "uninterrupted"), str(folder / "preempted")]:
        raise AssertionError(f"{trainer}'s first process ended at {done} ({first.returncode}):\n{first.stderr[-4000:]}")
    left = {"returncode": first.returncode, "done": done, "stderr": first.stderr[-2000:],
            "preempted": {kind: (folder / "preempted" / kind / "preempted").read_text() for kind in kinds},
            "preempted_saved": {kind: saved_steps(folder / "preempted" / kind) for kind in kinds},
            "killed_saved": saved_steps(folder / "killed" / killed_kind),
            "killed_input": (folder / "killed" / killed_kind / f"ckpt-{MID_EPOCH}" / "input.bin").exists()}
    (folder / "left.json").write_text(json.dumps(left))
    for name, step in STEP_OF.items():
        copy_up_to(folder / "uninterrupted", folder / name, kinds, step)
    train(*(job(trainer, folder / name, kinds) for name in [*STEP_OF, "preempted"]),
          job(trainer, folder / "killed", [killed_kind]))
    return folder


@pytest.fixture(scope="module")
def runs(made_once):
    """Per trainer: its runs (interrupted_then_resumed), made by the first test that asks."""
    def of(trainer: str) -> Path:
        return made_once(f"user-data-{trainer}", lambda folder: interrupted_then_resumed(trainer, folder))
    return of


def copy_up_to(source: Path, target: Path, kinds: list[str], step: int) -> None:
    """The checkpoints a run killed right after saving `step` leaves: `source`'s up to that step."""
    if (source / "files").exists():
        shutil.copytree(source / "files", target / "files")
    for kind in kinds:
        shutil.copytree(source / kind, target / kind, ignore=shutil.ignore_patterns("result.npz", "warnings.json"))
        for checkpoint in (target / kind).glob("ckpt-*"):
            if int(checkpoint.name.split("-")[1]) > step:
                shutil.rmtree(checkpoint)


def assert_resumed_as_said(reference: Path, resumed: Path, kinds: list[str]) -> None:
    """Each kind's resumed run equals the uninterrupted one bit for bit where `resume` is exact;
    the kinds with a rule said it once, in the words of their `says`."""
    for kind in kinds:
        said = json.loads((resumed / kind / "warnings.json").read_text())
        if "says" in KINDS[kind]:
            assert len(said) == 1 and KINDS[kind]["says"] in said[0], (kind, said)
        else:
            assert said == [], (kind, said)
        expected, got = np.load(reference / kind / "result.npz"), np.load(resumed / kind / "result.npz")
        equal = all(np.array_equal(expected[name], got[name]) for name in expected.files)
        assert equal == (KINDS[kind]["resume"] == "exact"), (kind, expected["loss"], got["loss"])


@pytest.mark.parametrize("trainer", CASES["trainers"])
@pytest.mark.parametrize("step", list(STEP_OF))
def test_every_kind_resumes_from_a_checkpoint_as_the_uninterrupted_run(runs, trainer, step):
    made = runs(trainer)
    assert_resumed_as_said(made / "uninterrupted", made / step, kinds_of(trainer))


@pytest.mark.parametrize("trainer", CASES["trainers"])
def test_every_kind_preempted_by_sigterm_resumes_as_the_uninterrupted_run(runs, trainer):
    made, kinds = runs(trainer), kinds_of(trainer)
    left = json.loads((made / "left.json").read_text())
    for kind in kinds:  # each saved the step SIGTERM came at (not one on the save grid) and stopped
        assert left["preempted"][kind] == "75"
        assert max(left["preempted_saved"][kind]) == PREEMPTED_AT
    assert_resumed_as_said(made / "uninterrupted", made / "preempted", kinds)


@pytest.mark.parametrize("trainer", CASES["trainers"])
def test_sigkill_mid_epoch_then_the_same_call_ends_as_the_uninterrupted_run(runs, trainer):
    made = runs(trainer)
    left = json.loads((made / "left.json").read_text())
    assert left["returncode"] == -9 and left["done"] == [str(made / "uninterrupted"), str(made / "preempted")], left
    assert left["killed_saved"][-1] == MID_EPOCH and left["killed_input"], left
    assert_resumed_as_said(made / "uninterrupted", made / "killed", [KILLED_KIND[trainer]])


# -- several workers ----------------------------------------------------------------------------
MULTI_WORKER_KINDS = ["shuffle-reshuffled", "guide-cache-prefetch", "interleave-tfrecord", "py-dataset"]


def launched(root: Path, *flags: str, max_restarts: int = 0) -> None:
    from kerasdist import launch

    result = launch([str(SCRIPT), "distributed_fit", str(root), ",".join(MULTI_WORKER_KINDS), *flags],
                    num_workers=2, max_restarts=max_restarts, timeout=500)
    assert result.ok, result


@pytest.fixture(scope="module")
def two_workers(made_once):
    """Every multi-worker kind trained by 2 workers of the launcher, one directory for both."""
    return made_once("user-data-two-workers", lambda folder: (launched(folder), folder)[1])


def weights(path: Path) -> list[np.ndarray]:
    saved = np.load(path)
    return [saved[name] for name in saved.files if name != "loss"]


def test_two_workers_without_a_shared_disk_resume_a_killed_worker_as_the_uninterrupted_run(two_workers, tmp_path):
    """Worker 1 SIGKILLed mid-epoch on hosts that share no disk: the launcher restarts the group,
    the chief's checkpoint (its data position included) resumes both workers, and each ends with
    the uninterrupted run's weights (the resumed epoch's logged mean is the batches after the
    resume's on every worker: RELIABILITY.md's known limit of #42)."""
    launched(tmp_path, "--per-worker-dir", "--kill-at", str(KILLED_AT), "--kill-task", "worker:1", max_restarts=1)
    for kind in MULTI_WORKER_KINDS:
        assert not list((tmp_path / kind / "worker-1").glob("ckpt-*"))  # only the chief writes
        for result in ("result.npz", "result-worker-1.npz"):
            expected, got = weights(two_workers / kind / result), weights(tmp_path / kind / result)
            assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True)), (kind, result)


def test_a_resume_on_one_worker_re_splits_the_rest_of_the_epoch(two_workers, tmp_path):
    """The 2 workers' checkpoint (its position is every worker's: each reads the whole pipeline)
    resumed by one process of 2 replicas: the same global batches, split as before, so the run
    ends as the 2 workers' did, within float rounding (another reduction order)."""
    copy_up_to(two_workers, tmp_path, MULTI_WORKER_KINDS, MID_EPOCH)
    train(job("distributed_fit", tmp_path, MULTI_WORKER_KINDS))
    for kind in MULTI_WORKER_KINDS:
        expected, got = weights(two_workers / kind / "result.npz"), weights(tmp_path / kind / "result.npz")
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=kind)


class StopAt(keras.callbacks.Callback):
    """Raises after global step `step` (as a crash would end the run there)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise RuntimeError("stopped here")


def reshuffled_batches() -> tf.data.Dataset:
    keras.utils.set_random_seed(5)  # the global seed a seeded shuffle pairs with, before each build
    x = np.linspace(0, 1, 96, dtype="float32").reshape(32, 3)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1))).shuffle(32, seed=3).batch(4)


def small_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("where", ["local", "memory"])
def test_the_input_position_resumes_through_sync_saves_and_object_stores(tmp_path, where):
    """A reshuffled pipeline (its position and shuffle state in each checkpoint) stopped after step
    11, inside epoch 1 (8 steps an epoch, a synchronous save every 3), resumed from step 9 ends as
    the uninterrupted run, bit for bit, on a disk and on an object store. (Background saves: the
    kill tests above.)"""
    def url(name):
        return str(tmp_path / name) if where == "local" else f"memory://user-data-{tmp_path.name}-{name}"

    def run(name, epochs, callbacks=()):
        model = kerasdist.make_or_restore_model(url(name), small_model)
        checkpoint = kerasdist.checkpoint_callback(url(name), every_steps=3, async_save=False)
        kerasdist.resume_fit(model, reshuffled_batches(), epochs, checkpoint, callbacks=list(callbacks), verbose=0)
        return model

    reference = run("uninterrupted", 3)
    with pytest.raises(RuntimeError, match="stopped here"):
        run("stopped", 3, [StopAt(11)])
    assert kerasdist.latest_checkpoint(url("stopped")).global_step == 9
    assert "holds every shuffle's random state" in kerasdist.resume_rule(reshuffled_batches())
    resumed = run("stopped", 3)
    assert int(resumed.optimizer.iterations.numpy()) == 24
    for ours, theirs in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_a_reshuffled_pipeline_resumes_where_it_is_whenever_its_state_holds_every_shuffle():
    """A "pass start" pipeline (two shuffles; a shuffle feeding an interleave is the same case)
    keeps its position where it is when tf.data's state holds every shuffle's random state, else
    its last one that did (compat.shuffle_counts_kept), with the batches since. A new
    pipeline (a new process's: new seed generators) resumed at any batch reads the uninterrupted
    run's batches, bit for bit, having read again only those."""
    import struct

    from kerasdist import compat
    from kerasdist.data.resumable import DatasetInput, _decoded

    def stream():  # no prefetch injected: which states lack a count is then no matter of timing
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.range(12).shuffle(12, seed=1).shuffle(4, seed=2).batch(2).with_options(options)

    source = DatasetInput(stream())
    assert source.rule == "pass start"
    source.start(None, None, 0, 0)
    states, batches = [], []
    for _ in range(18):
        states.append(source.state())
        batches.append(source.next_batch().numpy().tolist())
    for at in range(12):
        resumed = DatasetInput(stream())
        resumed.start(None, states[at], 0, 0)
        assert [resumed.next_batch().numpy().tolist() for _ in range(6)] == batches[at:at + 6], at
    # read again: none where the state holds both shuffles' counts; the batches since the last one
    # that did before a pass's last batch (the second shuffle has dropped the first) and at the next
    # pass's start (its shuffles not open yet); before the first batch, the run's first iterator
    read_again = [_decoded(state)[1] for state in states[:12]]
    assert read_again == [0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 1], read_again
    assert _decoded(states[0])[0] is None
    assert all(compat.shuffle_counts_kept(_decoded(state)[0]) == 2 for state in states[1:]), read_again
    # a position written before (b"kdp1": a state and the batches read since) still resumes
    older = DatasetInput(stream())
    older.start(None, struct.pack("<4sQ", b"kdp1", 2) + _decoded(states[4])[0], 0, 0)
    assert [older.next_batch().numpy().tolist() for _ in range(6)] == batches[6:12]


def test_a_read_ahead_pipeline_whose_steps_were_counted_resumes_exactly_at_every_step(tmp_path):
    """The resume_fit kind "interleave-tfrecord" as the trainers read it: its steps counted by a
    pass first (which draws from the shuffles' seed generators), files through a parallel
    interleave, a shuffle, a prefetch. tf.data reads ahead, so whether a state holds every
    shuffle's count depends on timing, a pass's start included, and the run's first states lack
    them: a state at every step, each resumed by a new pipeline, reads the uninterrupted run's
    batches bit for bit (before, a run resumed in its first epoch, and often one resumed at a
    pass's start, read another order)."""
    from kerasdist.data.resumable import DatasetInput, _decoded

    for part in range(3):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{part}.tfrecord")) as writer:
            for record in range(32):
                writer.write(f"{part}-{record:02d}".encode())

    def pipeline():
        names = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=True, seed=5)
        records = names.interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2, deterministic=True)
        return records.shuffle(40, seed=6).batch(16).prefetch(2)

    source = DatasetInput(pipeline())
    assert source.rule == "pass start" and source.count_steps() == 6
    source.start(None, None, 0, 0)
    states, batches = [], []
    for _ in range(24):
        batches.append(source.next_batch().numpy().tolist())
        states.append(source.state())
    for at, state in enumerate(states[:18], start=1):
        resumed = DatasetInput(pipeline())
        resumed.count_steps(6)  # recorded by the checkpoint: no pass read
        resumed.start(None, state, at // 6, at % 6)
        read = [resumed.next_batch().numpy().tolist() for _ in range(6)]
        assert read == batches[at:at + 6], (at, _decoded(state)[1:])
