"""`make upstream-check`: which of kerasdist's Keras workarounds the next Keras still needs.

Makes a scratch virtualenv (build/upstream-check) that sees the project's .venv packages but has
`keras-nightly` installed over its Keras (and `tf-nightly-cpu` over TensorFlow, where PyPI has one
newer than the installed TensorFlow), then runs the museum of upstream reports there
(tests/python/scripts/upstream_*.py) with every patch forced on, and prints a table, one row a
workaround:

- still needed: the reporter's code fails the upstream way as released, and trains with the patch;
- no longer needed: the code works as released (drop the patch, end its version gate);
- broken: it fails as released and the patch does not make it train (or the museum itself fails).
Then the other shims' canary tests (CANARIES): "still needed" while a canary holds, "check" when
it fails (upstream changed, or the shim's version gate ends before this version).

usage: tools/upstream_check.py [--python .venv/bin/python] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "python" / "scripts"
TOLERANCE = 1e-5
# The other compat shims' canaries (each passes while upstream still behaves as the shim assumes):
# the workaround, and its test.
CANARIES = {
    "saving_lib skip-set cache key (warm_saving_skipsets)":
        "test_multi_worker.py::test_upstream_saving_still_caches_its_skipsets_under_a_key_it_never_reads",
    "save_model refuses file objects (keras_model_bytes)":
        "test_storage.py::test_keras_public_save_still_refuses_file_objects",
    "saving internals the background snapshot uses":
        "test_background_save.py::test_keras_version_is_one_the_snapshot_was_checked_on",
    "saving walk replayed = model.save (record_save, write_keras_zip)":
        "test_compat.py::test_the_recorded_walk_replayed_writes_model_saves_files",
    "load_weights reading the weights member in place (load_keras_weights)":
        "test_compat.py::test_weights_read_in_place_are_those_load_weights_reads",
    "a build's random initializers deferred until a restore (initializers_deferred)":
        "test_compat.py::test_deferred_initializers_give_the_values_of_a_plain_build",
    "values read into the tensors their variables take over (load_keras_weights)":
        "test_compat.py::test_values_are_read_into_the_tensors_their_variables_take_over",
    "a restore's large variables started unfilled (initializers_deferred)":
        "test_compat.py::test_large_variables_about_to_be_restored_start_unfilled",
    "Variable.assign_add not atomic (atomic_variable_increments, ps)":
        "test_compat.py::test_keras_variable_increments_are_still_a_read_and_a_separate_write",
    "Variable.assign_add patch, forced (atomic_variable_increments)":
        "test_compat.py::test_within_the_block_increments_are_one_atomic_op_and_keras_comes_back_after_it",
    "tf.data Grappler per iterator (map_on_cpu)":
        "test_data.py::test_tf_data_still_runs_grappler_on_each_plain_map_function_but_not_on_kerasdists",
    "marked int32 functions fail (map_on_cpu)":
        "test_data.py::test_a_marked_function_with_an_int32_result_still_fails_upstream",
    "PreemptionCheckpointHandler on GCE CPU VMs":
        "test_preemption.py::test_upstream_handler_still_does_nothing_on_gce_cpu_vms",
    "SlurmClusterResolver on CPU-only nodes":
        "test_strategy.py::test_upstream_slurm_resolver_still_fails_on_cpu_only_nodes",
    # private names read, no patch: each accessor's canary
    "a model's layers at every depth (layers_within)":
        "test_compat.py::test_canary_layers_within_reaches_nested_models_layers",
    "compile()'s metrics and Keras's function wrappers (compiled_metrics, wrapped_function)":
        "test_compat.py::test_canary_compiled_metrics_and_wrapped_functions_are_what_compile_was_given",
    "the optimizer's batch counter (optimizer_batch_counter)":
        "test_compat.py::test_canary_the_optimizer_batch_counter_counts_batches_under_gradient_accumulation",
    "a model built from one batch (symbolic_build, ps)":
        "test_compat.py::test_canary_a_symbolic_build_makes_every_variable_without_a_step",
    "a variable's replicas (replica_variables)":
        "test_compat.py::test_canary_a_variable_made_under_a_strategy_gives_its_replicas",
    "ModelCheckpoint's and TensorBoard's private state, TensorBoard's writers":
        "test_callback_state.py::test_canary_keras_callbacks_keep_state_in_the_attributes_kerasdist_saves_and_reset_it_each_fit",
    "TensorBoard's open writers (tensorboard_writers)":
        "test_compat.py::test_canary_tensorboard_keeps_its_open_writers_where_kerasdist_flushes_them",
    "the coordination service's key-value store and barrier (preemption agreement)":
        "test_compat.py::test_canary_the_coordination_service_calls_kerasdist_makes_are_tensorflows",
    "Slurm host lists (slurm_tasks_per_host)":
        "test_compat.py::test_canary_slurm_host_lists_are_read_as_the_slurm_resolver_reads_them",
    # the data users bring, resumable (#58)
    "an iterator's state as bytes (iterator_state, restore_iterator_state)":
        "test_compat.py::test_canary_an_iterator_state_taken_as_bytes_resumes_a_new_iterator_exactly",
    "ops refusing symbolic checkpoints (SYMBOLIC_REFUSED)":
        "test_compat.py::test_canary_the_ops_listed_as_refusing_symbolic_checkpoints_still_do_and_batch_does_not",
    "a dataset's graph and its output node (dataset_graph, dataset_output)":
        "test_compat.py::test_canary_a_datasets_graph_ends_in_the_node_dataset_output_names",
    "fit stepping through kerasdist's stream (keras_stream)":
        "test_compat.py::test_canary_keras_fit_steps_through_kerasdists_stream_one_pull_per_step_and_its_peek_comes_back",
    "tf.timestamp refused under op determinism (the step times' clock)":
        "test_compat.py::test_tensorflows_own_clock_still_refuses_to_run_under_op_determinism",
    "all-reduces through CollectiveReplicaLauncher.all_reduce (time_collectives)":
        "test_compat.py::test_every_multi_worker_all_reduce_still_goes_through_the_launcher_the_step_times_time",
    "the coordination service's store through the eager context (coordination_store)":
        "test_compat.py::test_the_coordination_service_store_is_still_reached_through_the_eager_contexts_private_methods",
}


def scratch_env(python: str) -> Path:
    """build/upstream-check: a virtualenv over `python`'s packages, nightlies installed on top."""
    venv = ROOT / "build" / "upstream-check"
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    base, own = (site_packages(p) for p in (python, str(venv / "bin" / "python")))
    # after the venv's own site-packages: what is installed here wins over the project's .venv
    Path(own, "project_venv.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--pre"]
    subprocess.run([*pip, "keras-nightly"], check=True)
    tf_nightly = newer_tensorflow(str(venv / "bin" / "python"))
    if tf_nightly:
        subprocess.run([*pip, f"tf-nightly-cpu=={tf_nightly}"], check=True)
    return venv / "bin" / "python"


def site_packages(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def newer_tensorflow(python: str) -> str | None:
    """The newest tf-nightly-cpu on the package index when it is newer than the TensorFlow
    installed, else None."""
    installed = subprocess.run([python, "-c", "import tensorflow as tf; print(tf.__version__)"],
                               capture_output=True, text=True).stdout.strip()
    listed = subprocess.run([python, "-m", "pip", "index", "versions", "--pre", "tf-nightly-cpu"],
                            capture_output=True, text=True).stdout
    found = re.search(r"tf-nightly-cpu \(([^)]+)\)", listed)
    if not found or not installed:
        return None
    return found.group(1) if _release(found.group(1)) > _release(installed) else None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def run(python: str, args: list[str], folder: str) -> tuple[dict | None, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([python, *args], capture_output=True, text=True, env=env, cwd=folder, timeout=900)
    objects = re.findall(r"^(?:\[worker \d\] )?(\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or not objects:
        return None, (done.stdout + done.stderr)[-2000:]
    return [json.loads(o) for o in objects], ""


def status(plain: str, works: bool) -> str:
    if plain == "works":
        return "no longer needed"
    return "still needed" if works else "broken"


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOLERANCE * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def rows(python: str) -> tuple[list[tuple[str, str, str, str]], dict]:
    table: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="kerasdist-upstream-") as folder:
        mirrored, why = run(python, [str(SCRIPTS / "upstream_mirrored.py"), folder, "--forced"], folder)
        if mirrored is None:
            table.append(("mirrored museum", "-", "broken", f"the script failed: {why.splitlines()[-1:]}"))
        else:
            m = mirrored[-1]
            fixed = all(m[k] < TOLERANCE for k in ("uneven_fit_gap", "uneven_small_gap", "uneven_evaluate_gap",
                                                    "custom_fit_gap", "resume_fit_gap"))
            table.append(("uneven batch: symbolic build (AddN)", m["uneven_plain"], status(m["uneven_plain"], fixed),
                          f"weights vs one device {m['uneven_fit_gap']:.1e}"))
            weighting = "works" if m["uneven_build_only_gap"] < TOLERANCE else "1/replicas weighting"
            table.append(("uneven batch: loss weighted by rows", weighting, status(weighting, fixed),
                          f"as released {m['uneven_build_only_gap']:.1e}"))
            loop_ok = m["custom_loop_gap"] < TOLERANCE and m["custom_loop_moved"] > 1e-3
            table.append(("keras#23085 optimizer variables", m["custom_loop_plain"],
                          status(m["custom_loop_plain"], loop_ok), f"weights vs one device {m['custom_loop_gap']:.1e}"))
            versions = {"keras": m["keras"], "tensorflow": m["tensorflow"]}
        workers, why = run(python, ["-m", "kerasdist", "launch", "-n", "2", "--", python,
                                    str(SCRIPTS / "upstream_multi_worker.py"), "--forced"], folder)
        single, why_single = run(python, [str(SCRIPTS / "upstream_multi_worker.py"), "--single", "--forced"], folder)
        if workers is None or single is None or len(workers) != 2:
            table.append(("multi-worker museum", "-", "broken", f"failed: {(why or why_single).splitlines()[-1:]}"))
        else:
            for report, what in (("keras_20329", "keras#20329 dict inputs (MWMS)"),
                                 ("ray_47464", "ray#47464 Ray Train example (MWMS)"),
                                 ("tensorflow_72388", "tensorflow#72388 scalar reduction (MWMS)")):
                plain = workers[0][f"{report}_plain"]
                ok = workers[0][report] == workers[1][report] and close(workers[0][report], single[-1][report])
                table.append((what, plain[:60], status(plain, ok), "both workers = one device" if ok else "differs"))
    return table, versions if mirrored else {}


def _why(failure: Any) -> str:
    """The failing line of a junit failure (`>   assert ...`) and its message."""
    lines = [line[1:].strip() for line in (failure.text or "").splitlines() if line.startswith(">")]
    return " / ".join(part for part in (lines[-1] if lines else "", failure.get("message") or "") if part)


def canary_rows(python: str) -> list[tuple[str, str, str, str]]:
    """The other shims' canary tests, run under `python`: a pass means upstream still behaves as
    the shim assumes; a failure means look (upstream changed, or the shim's version gate ends
    before this version and the test says so)."""
    import xml.etree.ElementTree as ElementTree

    tests = ROOT / "tests" / "python"
    with tempfile.TemporaryDirectory(prefix="kerasdist-canaries-") as folder:
        report = Path(folder) / "junit.xml"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "TF_CPP_MIN_LOG_LEVEL": "2"}
        subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        *(str(tests / node) for node in CANARIES.values())],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
        outcomes = {}
        if report.exists():
            for case in ElementTree.parse(report).iter("testcase"):
                failure = case.find("failure")
                if failure is None:
                    failure = case.find("error")
                outcomes[case.get("name")] = None if failure is None else _why(failure)
    table = []
    for what, node in CANARIES.items():
        name = node.split("::")[1]
        if name not in outcomes:
            table.append((what, "-", "broken", "the canary did not run"))
        elif outcomes[name] is None:
            table.append((what, "canary holds", "still needed", name))
        else:
            table.append((what, "canary fails", "check", outcomes[name].splitlines()[0][:140]))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--in-place", action="store_true", help="use --python as it is (no scratch env)")
    args = parser.parse_args()
    python = os.path.abspath(args.python) if args.in_place else str(scratch_env(args.python))
    table, versions = rows(python)
    table += canary_rows(python)
    print(f"kerasdist upstream check: Keras {versions.get('keras', '?')}, TensorFlow {versions.get('tensorflow', '?')}")
    print("| workaround | as released | status | with the patch |")
    print("| --- | --- | --- | --- |")
    for row in table:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    return 1 if any(row[2] == "broken" for row in table) else 0


if __name__ == "__main__":
    sys.exit(main())
