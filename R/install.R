# One call that gives keras3 and kerasdist one Python: install_kerasdist().

DEFAULT_ENVNAME <- "r-keras"

#' Install kerasdist's Python package and its pinned stack into a virtualenv
#'
#' The keras3 way to set up Python once (as `keras3::install_keras()`): creates
#' the virtualenv `envname` if it does not exist and installs into it the
#' kerasdist Python package that came with this R package, with TensorFlow,
#' Keras, NumPy, pandas, matplotlib and TensorBoard at the versions kerasdist is tested
#' with. The default, `"r-keras"`, is the environment keras3 uses too, so after
#' restarting R, `library(keras3)` and `library(kerasdist)` share one Python.
#' Packages come from PyPI (or the index pip is configured with).
#'
#' @param envname Name of the virtualenv (under reticulate's virtualenv root),
#'   or a path to one; created if missing.
#' @param python The Python used to create a new virtualenv; `NULL` lets
#'   reticulate choose one (Python >= 3.10 is needed).
#' @param gpu Install TensorFlow's CUDA build (`tensorflow[and-cuda]`) instead
#'   of the CPU build.
#' @param source The kerasdist Python package to install: a wheel, or a
#'   kerasdist source checkout; `NULL` for the Python package bundled with
#'   this R package (copied from its source when it was installed).
#' @param pip_args More arguments for `pip install`, e.g. `"--no-cache-dir"`.
#' @param storage Object stores for `checkpoint_dir` URLs: `"s3"` (s3fs, for
#'   `s3://` and S3-compatible stores) and/or `"gcs"` (gcsfs, for `gs://`);
#'   `NULL` (default) for local checkpoint directories only.
#' @returns The path of the environment's Python, invisibly.
#' @family setup
#' @seealso [kerasdist_python()] for the Python kerasdist uses.
#' @examples
#' \dontrun{
#' kerasdist::install_kerasdist()   # once; then restart R
#' library(keras3)
#' library(kerasdist)
#' }
#' @export
install_kerasdist <- function(envname = DEFAULT_ENVNAME, python = NULL, gpu = FALSE, source = NULL,
                              pip_args = NULL, storage = NULL) {
  if (!is.character(envname) || length(envname) != 1 || !nzchar(envname)) {
    kerasdist_abort("envname must be the name of, or a path to, a virtualenv (one string).", call = sys.call())
  }
  if (!isTRUE(gpu) && !isFALSE(gpu)) kerasdist_abort("gpu must be TRUE or FALSE.", call = sys.call())
  check_storage(storage, sys.call())
  package <- python_package_source(source)
  checkout <- file.path(package, "tools", "constraints.txt")
  constraints <- if (file.exists(checkout)) checkout else bundled_python_file("constraints.txt")
  if (!file.exists(constraints)) {
    kerasdist_abort(sprintf("The pinned versions (%s) are missing: reinstall the kerasdist R package from its source.",
                            constraints), type = "RuntimeError", call = sys.call())
  }
  # packages = "pip": pip, wheel and setuptools brought up to date, without the default unpinned
  # NumPy, which the pinned install below would download again and replace
  if (!reticulate::virtualenv_exists(envname)) {
    reticulate::virtualenv_create(envname, python = python, packages = "pip")
  }
  env_python <- reticulate::virtualenv_python(envname)
  requirement <- sprintf("%s[%s]", package, paste(c(if (gpu) "gpu" else "cpu", unique(storage)), collapse = ","))
  args <- c("-m", "pip", "install", "--disable-pip-version-check", pip_args,
            "-c", constraints, requirement, "pandas", "matplotlib", "tensorboard")
  message(sprintf("Installing kerasdist and its pinned stack into %s", env_python))
  # Without R's library path: R puts the system's library folder first, where a Python built
  # elsewhere (pyenv) can pick up the system's libpython and lose its ssl module.
  status <- system2(env_python, shQuote(args), env = "LD_LIBRARY_PATH=")
  if (!identical(status, 0L)) {
    kerasdist_abort(sprintf("pip could not install kerasdist into %s (status %d); see pip's output above.",
                            env_python, status), type = "RuntimeError", call = sys.call())
  }
  message("Done. Restart R; keras3 and kerasdist will both use ", env_python, ".")
  invisible(env_python)
}

python_package_source <- function(source) {
  if (is.null(source)) {
    bundled <- bundled_python_file("source")
    if (!file.exists(file.path(bundled, "pyproject.toml"))) {
      kerasdist_abort(paste0(
        "This installation of the kerasdist R package carries no Python package (its installer ",
        "copies it from the source's python/ folder): reinstall it from a kerasdist source ",
        "(a clone, or the tarball of `make dist`), or pass source = \"path/to/kerasdist checkout\"."
      ), call = sys.call(-1))
    }
    return(normalizePath(bundled))
  }
  if (!is.character(source) || length(source) != 1 || !file.exists(source)) {
    kerasdist_abort(sprintf("source must be a kerasdist wheel or source checkout, got %s.",
                            paste(format(source), collapse = " ")), call = sys.call(-1))
  }
  normalizePath(source)
}

# What the package's configure script bundles in inst/python: the Python sources (source/) and
# tools/constraints.txt.
bundled_python_file <- function(...) {
  file.path(system.file("python", package = "kerasdist", mustWork = FALSE), ...)
}
