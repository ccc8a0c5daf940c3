"""The artifacts people install (`make dist`): the wheel into a new, empty virtualenv, and the R
source tarball into an empty R library followed by `install_kerasdist()`, each used outside the
checkout with nothing from `make` in the way (no .venv on the path, no KERASDIST_PYTHON)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import kerasdist

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "tools" / "constraints.txt"
VERSION = kerasdist.__version__
# What `make test` and the checkout put in the environment, which an installed package must not need.
CHECKOUT_VARIABLES = ("KERASDIST_PYTHON", "RETICULATE_PYTHON", "PYTHONPATH", "VIRTUAL_ENV", "KERASDIST_REQUIRE_PYTHON",
                      "R_LIBS", "R_LIBS_USER", "WORKON_HOME")

TRAIN = textwrap.dedent("""
    # train.py CHECKPOINT_DIR WEIGHTS.npz [CHECKPOINT_DIR WEIGHTS.npz]: one fit per pair, in order, each
    # from the same seeds; KILL_AT=step SIGKILLs the last fit at that step.
    import os, signal, sys
    import numpy as np, keras, kerasdist

    print("kerasdist from", kerasdist.__file__, flush=True)

    class Kill(keras.callbacks.Callback):
        def __init__(self, step):
            super().__init__()
            self.step = step

        def on_train_batch_end(self, batch, logs=None):
            if self.step and int(self.model.optimizer.iterations.numpy()) == self.step:
                os.kill(os.getpid(), signal.SIGKILL)

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        return model

    def train(checkpoint_dir, weights, kill_at):
        keras.backend.clear_session()  # each fit as in a new process: layer names, seeds
        keras.utils.set_random_seed(1)  # the initial weights; `seed` below orders the epochs
        x = np.linspace(0, 1, 256, dtype="float32").reshape(64, 4)
        history = kerasdist.distributed_fit(build, x, x.sum(1), epochs=4, checkpoint_dir=checkpoint_dir,
                                            strategy="default", batch_size=8, every_steps=3, seed=1, verbose=0,
                                            callbacks=[Kill(kill_at)])
        np.savez(weights, *history.model.get_weights())

    runs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    for number, (checkpoint_dir, weights) in enumerate(runs, 1):
        train(checkpoint_dir, weights, int(os.environ.get("KILL_AT", "0")) if number == len(runs) else 0)
""")


def clean_environment(**extra: str) -> dict[str, str]:
    """Without PYTHONDONTWRITEBYTECODE (set on this machine), as on a user's: an environment's
    Python then caches its bytecode once, at its first run, as it would for them."""
    env = {k: v for k, v in os.environ.items() if k not in (*CHECKOUT_VARIABLES, "PYTHONDONTWRITEBYTECODE")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))]
    return {**env, "PATH": os.pathsep.join(path), "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def dist(made_once) -> Path:
    """`make dist`'s script, into a fresh directory (the R tarball without its vignettes, which
    R CMD build runs in `make test` anyway); once for all workers."""

    def make(out: Path) -> Path:
        run([ROOT / "tools" / "dist.sh", out], ROOT, {**os.environ, "KERASDIST_DIST_VIGNETTES": "0"})
        return out

    return made_once("dist", make)


def test_dist_builds_a_wheel_an_sdist_and_an_r_tarball_that_carry_what_they_need(dist):
    wheel, sdist, r_tarball = (dist / f"kerasdist-{VERSION}-py3-none-any.whl", dist / f"kerasdist-{VERSION}.tar.gz",
                               dist / f"kerasdist_{VERSION}.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kerasdist/__init__.py" in names and "kerasdist_cli/__init__.py" in names
    assert "kerasdist/datasets/digits.csv.gz" in names and "kerasdist/py.typed" in names
    assert not any(name.startswith(("tests/", "tools/", "R/", "kerasdist_testing/")) for name in names)
    metadata = zipfile.ZipFile(wheel).read(f"kerasdist-{VERSION}.dist-info/METADATA").decode()
    assert "Provides-Extra: s3" in metadata and "Classifier: Programming Language :: Python :: 3" in metadata
    assert "kerasdist = kerasdist_cli:main" in zipfile.ZipFile(wheel).read(
        f"kerasdist-{VERSION}.dist-info/entry_points.txt").decode()
    assert f"kerasdist-{VERSION}/pyproject.toml" in tarfile.open(sdist).getnames()
    r_files = tarfile.open(r_tarball).getnames()
    for needed in ("configure", "python/kerasdist/__init__.py", "python/kerasdist_cli/__init__.py",
                   "pyproject.toml", "README.md", "tools/constraints.txt", "DESCRIPTION",
                   "tests/kerasdist_testing/s3_test_server.py"):  # for R CMD check's tests, not installed
        assert f"kerasdist/{needed}" in r_files, needed
    assert not any(name.startswith(("kerasdist/tests/python", "kerasdist/tools/setup", "kerasdist/.venv",
                                    "kerasdist/inst/python")) for name in r_files)


def test_the_wheel_installs_into_an_empty_virtualenv_and_a_killed_fit_resumes_bitwise(dist, tmp_path):
    venv, env = tmp_path / "venv", clean_environment()
    # Without pip in it (its bootstrap byte-compiles pip: 7 s of CPU); the checkout's pip, the
    # version venv would have put there, installs into it.
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    wheel, python = dist / f"kerasdist-{VERSION}-py3-none-any.whl", venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "-c", CONSTRAINTS,
         f"{wheel}[cpu,s3]"], tmp_path, env)
    assert run([venv / "bin" / "kerasdist", "--version"], tmp_path, env).stdout.strip() == f"kerasdist {VERSION}"

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    # The uninterrupted reference, then the fit killed at step 20, in one process (one TensorFlow start-up)
    killed = subprocess.run([python, script, tmp_path / "reference", tmp_path / "reference.npz", tmp_path / "run",
                             tmp_path / "killed.npz"], cwd=tmp_path, env={**env, "KILL_AT": "20"},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    listing = run([venv / "bin" / "kerasdist", "checkpoints", tmp_path / "run", "--json"], tmp_path, env).stdout
    restart = [row["global_step"] for row in json.loads(listing) if row["restart"]]
    assert len(restart) == 1 and 16 <= restart[0] < 20, listing  # an epoch ends at 16; the kill came at 20
    done = run([python, script, tmp_path / "run", tmp_path / "resumed.npz"], tmp_path, env)
    for output in (killed.stdout, done.stdout):
        assert f"kerasdist from {venv}/lib/" in output, output  # the installed package, not the checkout
    reference, resumed = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    assert all(np.array_equal(reference[name], resumed[name]) for name in reference)


@pytest.fixture(scope="module")
def r_library(dist, made_once) -> Path:
    """The R tarball installed into an empty library (keras3 and reticulate come from R's own), once
    for the R tests below: none of them writes into it."""

    def make(library: Path) -> Path:
        run(["R", "CMD", "INSTALL", "-l", library, dist / f"kerasdist_{VERSION}.tar.gz"], library, clean_environment())
        return library

    return made_once("r-library", make)


def test_the_r_tarball_installs_into_an_empty_library_and_install_kerasdist_makes_its_python(r_library, tmp_path):
    env = clean_environment(WORKON_HOME=str(tmp_path / "virtualenvs"), R_LIBS=str(r_library))
    base_python = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter itself, not a pyenv shim
    install = f'kerasdist::install_kerasdist(python = "{base_python}", pip_args = "--no-compile")'
    done = run(["Rscript", "-e", install], tmp_path, env, timeout=900)
    assert "Restart R; keras3 and kerasdist will both use" in done.stdout + done.stderr
    fit = textwrap.dedent("""
        library(keras3)
        library(kerasdist)
        cat("package:", find.package("kerasdist"), "\\n")
        cat("python:", kerasdist_python(), "\\n")
        build <- function() {
          model <- keras_model_sequential(input_shape = 4) |> layer_dense(8, activation = "relu") |> layer_dense(1)
          model |> compile(optimizer = "adam", loss = "mse")
          model
        }
        x <- matrix(seq_len(256) / 256, ncol = 4)
        history <- distributed_fit(build, x, rowSums(x), epochs = 2, checkpoint_dir = "ckpt", batch_size = 8,
                                   strategy = "default", verbose = 0)
        cat("epochs:", length(history$metrics$loss), "\\n")
        cat("checkpoints:", list_checkpoints("ckpt")$global_step, "\\n")
    """)
    out = run(["Rscript", "-e", fit], tmp_path, env, timeout=900).stdout  # its first run compiles TF's bytecode
    assert f"package: {r_library}/kerasdist" in out
    assert f"python: {tmp_path}/virtualenvs/r-keras/bin/python" in out
    assert "epochs: 2" in out and "checkpoints: 8 16" in out


# The keras3 path (issue #45): no Python set up by hand. reticulate builds one cached environment
# with uv from what keras3 and kerasdist declare (py_require); these tests share one uv cache.
NEW_R_USER_FIT = textwrap.dedent("""
    library(keras3)
    library(kerasdist)
    before <- latest_checkpoint("ckpt")  # the first call to use Python: kerasdist's, not keras3's (see below)
    cat("resuming from:", if (is.null(before)) 0L else before$global_step, "\n")
    build <- function() {
      keras_model_sequential(input_shape = 4) |> layer_dense(8, activation = "relu") |> layer_dense(1) |>
        compile(optimizer = "adam", loss = "mse")
    }
    term <- callback_lambda(on_train_batch_end = function(batch, logs) {
      if (nzchar(Sys.getenv("TERM_AT")) && batch == as.integer(Sys.getenv("TERM_AT")))
        tools::pskill(Sys.getpid(), tools::SIGTERM)
    })
    x <- matrix(seq_len(256) / 256, ncol = 4)
    history <- distributed_fit(build, x, rowSums(x), epochs = 3, checkpoint_dir = "ckpt", batch_size = 8,
                               strategy = "default", every_steps = 2, verbose = 0, callbacks = term)
    cat("python:", kerasdist_python(), "\\n")
    cat("kerasdist from:", reticulate::import("kerasdist")$`__file__`, "\\n")
    cat("checkpoints:", list_checkpoints("ckpt")$global_step, "\\n")
""")


@pytest.fixture(scope="module")
def uv_setup(made_once) -> dict[str, str]:
    """uv from PyPI in a folder of its own and one cache for these tests (the first build takes
    about 80 s, later ones reuse it). uv uses the system's Python: it cannot download one here."""

    def make(folder: Path) -> Path:
        run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", folder / "uv",
             "-c", CONSTRAINTS, "uv"], folder, clean_environment())
        return folder

    folder = made_once("uv", make)
    return {"RETICULATE_UV": str(folder / "uv" / "bin" / "uv"), "UV_CACHE_DIR": str(folder / "cache"),
            "UV_PYTHON_PREFERENCE": "only-system", "R_USER_CACHE_DIR": str(folder / "r-cache")}


def new_r_user(r_library: Path, uv_setup: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user's R session: nothing but the R packages installed, no virtualenv, no Python variable,
    and no Python version manager on the PATH. This machine's pyenv shims (bash scripts, one per
    installed version, failing for all but the global one) would be run again by every `uv python
    list` of reticulate 1.46's recursive search (see prebuild_ephemeral_python in R/python.R):
    about 1,900 bash processes and 60 s of CPU for keras3's start alone. uv then takes the system's
    Python, Debian's /usr/bin/python3 (with the shared libpython tools/setup.sh installs)."""
    env = clean_environment(R_LIBS=str(r_library), WORKON_HOME=str(tmp_path / "virtualenvs"),
                            TF_CPP_MIN_LOG_LEVEL="2", **uv_setup, **extra)
    env.pop("PYENV_ROOT", None)
    path = [p for p in env["PATH"].split(os.pathsep) if "pyenv" not in Path(p).parts and ".pyenv" not in Path(p).parts]
    return {**env, "PATH": os.pathsep.join(path)}


def rscript(script: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["Rscript", "-e", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_library_keras3_and_kerasdist_set_python_up_then_a_sigterm_exits_75_and_a_new_process_resumes(
        r_library, uv_setup, tmp_path):
    env = new_r_user(r_library, uv_setup, tmp_path)
    term = rscript(NEW_R_USER_FIT, tmp_path, {**env, "TERM_AT": "3"})  # keras3 counts batches from 1
    output = term.stdout + term.stderr
    assert term.returncode == 75, output[-3000:]  # saved, then exited for a launcher to restart
    assert "C stack usage" not in output and "make demo" not in output, output[-3000:]

    resumed = rscript(NEW_R_USER_FIT, tmp_path, env)
    out = resumed.stdout
    assert resumed.returncode == 0, (out + resumed.stderr)[-3000:]
    python = re.search(r"^python: (\S+)", out, re.M)[1]
    assert python.startswith(uv_setup["UV_CACHE_DIR"]), out  # reticulate's environment, built by uv
    assert re.search(rf"^kerasdist from: {re.escape(python.rsplit('/bin/', 1)[0])}/lib/.*site-packages/kerasdist/",
                     out, re.M), out  # the Python package bundled with the R package, installed there
    resumed_from = int(re.search(r"^resuming from: (\d+)", out, re.M)[1])
    assert 3 <= resumed_from < 8, out  # the step the SIGTERM saved, in the first epoch of 8 steps
    assert re.search(r"^checkpoints: .*\b24\s*$", out, re.M), out  # then on to the end of epoch 3


def test_kerasdist_after_keras3_started_its_python_adds_itself_to_that_environment(r_library, uv_setup, tmp_path):
    env = new_r_user(r_library, uv_setup, tmp_path)
    script = textwrap.dedent("""
        library(keras3)
        print(op_add(1, 2))            # keras3 starts reticulate's Python, without kerasdist in it
        library(kerasdist)
        digits <- load_digits(flatten = TRUE)
        cat("digits:", dim(digits$x), "\\n")
        cat("python:", kerasdist_python(), "\\n")
    """)
    done = rscript(script, tmp_path, env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "digits: 1797 64" in done.stdout
    assert "kerasdist: adding kerasdist to reticulate's Python environment" in output
    assert re.search(r"^python: " + re.escape(uv_setup["UV_CACHE_DIR"]), done.stdout, re.M), done.stdout
