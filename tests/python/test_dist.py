"""The artifacts people install (`make dist`): the wheel into a new, empty virtualenv, and the R
source tarball into an empty R library followed by `install_kerasdist()`, each used outside the
checkout with nothing from `make` in the way (no .venv on the path, no KERASDIST_PYTHON)."""

from __future__ import annotations

import json
import os
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
    import os, signal, sys
    import numpy as np, keras, kerasdist

    print("kerasdist from", kerasdist.__file__)
    kill_at = int(os.environ.get("KILL_AT", "0"))

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if kill_at and int(self.model.optimizer.iterations.numpy()) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        return model

    keras.utils.set_random_seed(1)  # the initial weights; `seed` below orders the epochs
    x = np.linspace(0, 1, 256, dtype="float32").reshape(64, 4)
    history = kerasdist.distributed_fit(build, x, x.sum(1), epochs=4, checkpoint_dir=sys.argv[1], strategy="default",
                                        batch_size=8, every_steps=3, seed=1, verbose=0, callbacks=[Kill()])
    np.savez(sys.argv[2], *history.model.get_weights())
""")


def clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CHECKOUT_VARIABLES}
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
    assert not any(name.startswith(("tests/", "tools/", "R/")) for name in names)
    metadata = zipfile.ZipFile(wheel).read(f"kerasdist-{VERSION}.dist-info/METADATA").decode()
    assert "Provides-Extra: s3" in metadata and "Classifier: Programming Language :: Python :: 3" in metadata
    assert "kerasdist = kerasdist_cli:main" in zipfile.ZipFile(wheel).read(
        f"kerasdist-{VERSION}.dist-info/entry_points.txt").decode()
    assert f"kerasdist-{VERSION}/pyproject.toml" in tarfile.open(sdist).getnames()
    r_files = tarfile.open(r_tarball).getnames()
    for needed in ("configure", "python/kerasdist/__init__.py", "python/kerasdist_cli/__init__.py",
                   "pyproject.toml", "README.md", "tools/constraints.txt", "DESCRIPTION"):
        assert f"kerasdist/{needed}" in r_files, needed
    assert not any(name.startswith(("kerasdist/tests/python", "kerasdist/tools/setup", "kerasdist/.venv",
                                    "kerasdist/inst/python")) for name in r_files)


def test_the_wheel_installs_into_an_empty_virtualenv_and_a_killed_fit_resumes_bitwise(dist, tmp_path):
    venv, env = tmp_path / "venv", clean_environment()
    run([sys.executable, "-m", "venv", venv], tmp_path, env)
    wheel = dist / f"kerasdist-{VERSION}-py3-none-any.whl"
    run([venv / "bin" / "pip", "install", "-q", "--no-compile", "-c", CONSTRAINTS, f"{wheel}[cpu,s3]"], tmp_path, env)
    assert run([venv / "bin" / "kerasdist", "--version"], tmp_path, env).stdout.strip() == f"kerasdist {VERSION}"

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    python = venv / "bin" / "python"
    done = run([python, script, tmp_path / "reference", tmp_path / "reference.npz"], tmp_path, env)
    assert f"kerasdist from {venv}/lib/" in done.stdout  # the installed package, not the checkout
    killed = subprocess.run([python, script, tmp_path / "run", tmp_path / "killed.npz"], cwd=tmp_path,
                            env={**env, "KILL_AT": "20"}, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    listing = run([venv / "bin" / "kerasdist", "checkpoints", tmp_path / "run", "--json"], tmp_path, env).stdout
    restart = [row["global_step"] for row in json.loads(listing) if row["restart"]]
    assert len(restart) == 1 and 16 <= restart[0] < 20, listing  # an epoch ends at 16; the kill came at 20
    run([python, script, tmp_path / "run", tmp_path / "resumed.npz"], tmp_path, env)
    reference, resumed = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    assert all(np.array_equal(reference[name], resumed[name]) for name in reference)


def test_the_r_tarball_installs_into_an_empty_library_and_install_kerasdist_makes_its_python(dist, tmp_path):
    library, env = tmp_path / "library", clean_environment(WORKON_HOME=str(tmp_path / "virtualenvs"))
    library.mkdir()
    run(["R", "CMD", "INSTALL", "-l", library, dist / f"kerasdist_{VERSION}.tar.gz"], tmp_path, env)
    env["R_LIBS"] = str(library)
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
    out = run(["Rscript", "-e", fit], tmp_path, env, timeout=300).stdout
    assert f"package: {library}/kerasdist" in out
    assert f"python: {tmp_path}/virtualenvs/r-keras/bin/python" in out
    assert "epochs: 2" in out and "checkpoints: 8 16" in out
