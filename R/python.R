# Finding the Python that holds kerasdist, and turning Python errors into readable R conditions.

.kerasdist <- new.env(parent = emptyenv())

#' The Python interpreter kerasdist uses
#'
#' kerasdist runs on a Python with TensorFlow, Keras 3 and the `kerasdist`
#' module. A Python chosen explicitly wins, in this order: the option
#' `kerasdist.python`; the environment variable `KERASDIST_PYTHON`; a `.venv`
#' in the working directory or one of its parents (the one `make demo` creates
#' in a source checkout); `RETICULATE_PYTHON`; the `"r-keras"` virtualenv that
#' [install_kerasdist()] (and `keras3::install_keras()`) create. If reticulate
#' has already started Python (for example because keras3 ran first), that
#' Python is used.
#'
#' With none of these, kerasdist takes the path keras3 takes: `library(kerasdist)`
#' declares its Python package (the copy that came with the R package) and the
#' versions it is tested with through [reticulate::py_require()], and reticulate
#' builds one cached environment holding what keras3 and kerasdist need the
#' first time Python is used (a minute or two, once; later sessions reuse it).
#' See [kerasdist_py_require()] for bucket support.
#'
#' @returns The path of the Python executable, or `NULL` if reticulate will set
#'   up its own when Python is first used.
#' @family setup
#' @examples
#' kerasdist_python()
#' @export
kerasdist_python <- function() {
  if (reticulate::py_available(initialize = FALSE)) {
    return(reticulate::py_config()$python)
  }
  chosen_python()$python
}

# The Python chosen explicitly, and what chose it (for messages): list(python, by), both NULL if none.
chosen_python <- function() {
  candidates <- c(
    "options(kerasdist.python)" = getOption("kerasdist.python", ""),
    KERASDIST_PYTHON = Sys.getenv("KERASDIST_PYTHON"),
    "a .venv in the working directory" = find_project_venv(getwd()),
    RETICULATE_PYTHON = Sys.getenv("RETICULATE_PYTHON"),
    'the "r-keras" virtualenv' = shared_keras_venv()
  )
  found <- candidates[nzchar(candidates) & file.exists(candidates)]
  if (length(found) == 0) return(list(python = NULL, by = NULL))
  # Not normalizePath(): it would resolve the venv's symlink to the base interpreter.
  list(python = path.expand(found[[1]]), by = names(found)[[1]])
}

# The virtualenv keras3 and kerasdist share after install_kerasdist(), if it exists.
shared_keras_venv <- function() {
  if (!reticulate::virtualenv_exists(DEFAULT_ENVNAME)) return("")
  reticulate::virtualenv_python(DEFAULT_ENVNAME)
}

find_project_venv <- function(dir) {
  dir <- normalizePath(dir, mustWork = FALSE)
  repeat {
    python <- file.path(dir, ".venv", "bin", "python")
    if (file.exists(python)) return(python)
    parent <- dirname(dir)
    if (identical(parent, dir)) return("")
    dir <- parent
  }
}

#' Declare kerasdist's Python requirements (the keras3 way)
#'
#' `library(kerasdist)` calls this for you: it declares, with
#' [reticulate::py_require()], the kerasdist Python package that came with the
#' R package, and appends the versions kerasdist is tested with (TensorFlow
#' 2.21, Keras 3.15, NumPy 2.2, ...) to the `UV_CONSTRAINT` environment
#' variable, as keras3 passes its own. Nothing is installed then: the first
#' time Python is used, reticulate builds one cached environment with what
#' keras3 and kerasdist need. keras3 chooses TensorFlow's build (the CUDA build
#' on Linux with a GPU); a Python chosen explicitly (see [kerasdist_python()])
#' is used as it is.
#'
#' Call it yourself, before the first keras3 or kerasdist call, to add
#' checkpoints in buckets, or set `options(kerasdist.storage = "s3")` (e.g. in
#' `.Rprofile`) before `library(kerasdist)`. After Python has started, it
#' adds the packages to reticulate's running environment where reticulate can
#' (its own environment, reticulate >= 1.45).
#'
#' @param storage Object stores for `checkpoint_dir` URLs: `"s3"` (fsspec and
#'   s3fs, for `s3://` and S3-compatible stores) and/or `"gcs"` (fsspec and
#'   gcsfs, for `gs://`); `NULL` for local checkpoint directories only.
#' @returns The Python requirements declared, invisibly.
#' @family setup
#' @seealso [install_kerasdist()] for a persistent virtualenv instead.
#' @examples
#' \dontrun{
#' library(keras3)
#' library(kerasdist)
#' kerasdist_py_require(storage = "s3")  # before the first call that uses Python
#' }
#' @export
kerasdist_py_require <- function(storage = NULL) {
  check_storage(storage, sys.call())
  requirements <- python_requirements(storage)
  if (is.null(requirements)) {
    kerasdist_abort(paste0(
      "This installation of the kerasdist R package carries no Python package (its installer copies it ",
      "from the source's python/ folder): reinstall kerasdist from its source tarball."
    ), type = "RuntimeError", call = sys.call())
  }
  append_uv_constraint(bundled_python_file("constraints.txt"))
  if (!reticulate::py_available(initialize = FALSE)) {
    reticulate::py_require(requirements)
  } else if (!add_to_running_python(requirements)) {
    python <- reticulate::py_config()$python
    venv <- virtualenv_of(python)
    warning(warningCondition(if (!isTRUE(reticulate::py_config()$ephemeral) && !is.null(venv)) {
      sprintf("Python runs from the virtualenv %s, which reticulate does not manage: run `kerasdist::install_kerasdist(\"%s\", storage = %s)` once, then restart R.",
              venv, venv, paste(deparse(storage), collapse = ""))
    } else {
      sprintf(paste0("Python already runs (%s) and reticulate cannot add packages to it: restart R and call ",
                     "kerasdist_py_require() before the first keras3 or kerasdist call."), python)
    }, call = sys.call(), class = "kerasdist_warning"))
  }
  invisible(requirements)
}

check_storage <- function(storage, call) {
  if (!is.null(storage) && (!is.character(storage) || !all(storage %in% c("s3", "gcs")))) {
    kerasdist_abort(sprintf('storage must be NULL or one or both of "s3" and "gcs", got %s.',
                            paste(format(storage), collapse = " ")), call = call)
  }
}

# The kerasdist Python package bundled with the R package as a local path requirement, then what
# each object store needs (the `s3` and `gcs` extras of pyproject.toml, as their own packages: an
# extra on the path requirement could not be added once Python runs). NULL without the bundle.
python_requirements <- function(storage = NULL) {
  source <- bundled_python_file("source")
  if (!file.exists(file.path(source, "pyproject.toml"))) return(NULL)
  stores <- c(s3 = "s3fs", gcs = "gcsfs")[intersect(c("s3", "gcs"), storage)]
  c(paste0("kerasdist@", normalizePath(source)), if (length(stores)) c("fsspec", unname(stores)))
}

# keras3's way of passing pins to uv: files appended to UV_CONSTRAINT, space-separated, once each.
append_uv_constraint <- function(file) {
  if (!file.exists(file)) return(invisible())
  files <- strsplit(Sys.getenv("UV_CONSTRAINT"), " ", fixed = TRUE)[[1]]
  Sys.setenv(UV_CONSTRAINT = paste(unique(c(files[nzchar(files)], file)), collapse = " "))
}

# On load, declare kerasdist's requirements (nothing is installed or started: reticulate builds the
# environment when Python is first used); if a Python was chosen, point reticulate at it (without
# starting it), so that a user's own reticulate::import("keras") before any kerasdist call gets the
# same interpreter; and have kerasdist's Python imported with TensorFlow, whoever imports it.
.onLoad <- function(libname, pkgname) {
  if (!reticulate::py_available(initialize = FALSE)) {
    storage <- getOption("kerasdist.storage")
    if (!is.null(storage) && !all(storage %in% c("s3", "gcs"))) {
      warning('options(kerasdist.storage) must be NULL or one or both of "s3" and "gcs"; ignored.', call. = FALSE)
    }
    requirements <- python_requirements(storage)
    if (!is.null(requirements)) {
      append_uv_constraint(bundled_python_file("constraints.txt"))
      reticulate::py_require(requirements)
    }
    python <- chosen_python()$python
    if (!is.null(python)) prefer_python(python)
  }
  reticulate::py_register_load_hook("tensorflow", import_with_tensorflow)
}

# Importing kerasdist fixes Keras 3's multi-worker fit and explains a multi-worker strategy made
# too late (python/kerasdist/compat/tf_distribute.py), so code that makes its own strategy with
# tensorflow::tf$distribute and trains with keras3's fit() needs only library(kerasdist). Quiet:
# a Python without kerasdist is reported by the first kerasdist call, not by TensorFlow's import.
# A user's own reticulate::import("kerasdist") brings TensorFlow in and so fires this hook: with
# kerasdist in sys.modules its fixes are applied, and no second import is started from inside the
# hook (reticulate runs every pending load hook again for each module imported inside one). The
# "C stack usage" message R users met on first use was reticulate's own search for a Python
# (prebuild_ephemeral_python), not this hook.
import_with_tensorflow <- function() {
  if (!is.null(.kerasdist$module) || isTRUE(.kerasdist$importing)) return(invisible())
  if (python_module_imported("kerasdist")) return(invisible())
  if (!python_module_installed("kerasdist")) return(invisible())
  tryCatch(kerasdist_module(), error = function(err) NULL)
  invisible()
}

prefer_python <- function(python) {
  # RETICULATE_PYTHON also stops reticulate 1.28 from reading this checkout's pyproject.toml as a
  # Poetry project (it warns, then ignores it).
  if (!nzchar(Sys.getenv("RETICULATE_PYTHON"))) Sys.setenv(RETICULATE_PYTHON = python)
  reticulate::use_python(python, required = FALSE)
}

# The kerasdist Python module, imported once; each missing piece gets one sentence and its fix.
kerasdist_module <- function() {
  if (is.null(.kerasdist$module)) {
    started_by_others <- reticulate::py_available(initialize = FALSE)
    chosen <- activate_python()
    require_kerasdist_python(started_by_others, chosen)
    if (isTRUE(getOption("kerasdist.verbose"))) python_environ()$update(list(KERASDIST_VERBOSE = "1"))
    hold_keras_load_hooks()
    .kerasdist$importing <- TRUE  # TensorFlow's load hook (import_with_tensorflow) runs inside
    on.exit(.kerasdist$importing <- FALSE)
    .kerasdist$module <- reticulate::import("kerasdist")
    .kerasdist$bridge <- reticulate::import("kerasdist._bridge")
    # R ends without finalizing Python: Python's exit handlers (run logs, temporary folders) run here
    reg.finalizer(.kerasdist, function(env) try(env$bridge$at_r_exit(), silent = TRUE), onexit = TRUE)
  }
  .kerasdist$module
}

# keras3 runs an op as soon as Python's keras is imported (its reticulate load hook), which starts
# TensorFlow's runtime; kerasdist's import brings keras in, so a CPU split or a multi-worker strategy
# asked for by that first kerasdist call would come too late. The hook is held back while kerasdist
# is imported and run when that call is done (call_python), after the strategy exists.
KERAS_LOAD_HOOK <- "reticulate::keras::load"

hold_keras_load_hooks <- function() {
  if (keras_imported()) return(invisible())
  .kerasdist$held_keras_hooks <- getHook(KERAS_LOAD_HOOK)
  setHook(KERAS_LOAD_HOOK, NULL, "replace")
}

run_held_keras_load_hooks <- function() {
  hooks <- .kerasdist$held_keras_hooks
  .kerasdist$held_keras_hooks <- NULL
  for (hook in hooks) hook()
}

# Starts Python if nobody has: the chosen one, or else reticulate's own environment from the
# requirements declared at load. Returns what chose it (chosen_python()), for the messages.
activate_python <- function() {
  if (reticulate::py_available(initialize = FALSE)) return(list(python = NULL, by = NULL))
  chosen <- chosen_python()
  if (is.null(chosen$python)) {
    # keras3 declares TensorFlow (its build: CUDA on Linux with a GPU, else CPU) when it is loaded;
    # library(kerasdist) alone does not load it (loading it at library(kerasdist) would register
    # keras3's load hook before a user's own multi-worker strategy, tests/testthat/scripts/user_strategy.R).
    # `keras3::` loads it here (and is the use R CMD check looks for of an Imports package).
    invisible(keras3::config_backend)
    started <- tryCatch({
      prebuild_ephemeral_python()
      reticulate::py_available(initialize = TRUE)
    }, error = function(err) err)
    if (!isTRUE(started)) {
      cause <- if (inherits(started, "error")) conditionMessage(started) else "no Python was found"
      setup_error(sprintf(paste0(
        "reticulate could not set up the Python environment for keras3 and kerasdist (%s): ",
        "make PyPI reachable (reticulate installs from it with uv, once) and call again."
      ), first_line(cause)))
    }
    return(chosen)
  }
  Sys.setenv(RETICULATE_PYTHON = chosen$python)
  reticulate::use_python(chosen$python, required = TRUE)
  if (!reticulate::py_available(initialize = TRUE)) {
    setup_error(sprintf("The Python at %s (from %s) could not be started: unset %s and kerasdist sets up its own.",
                        chosen$python, chosen$by, chosen$by))
  }
  chosen
}

# reticulate 1.46 builds its own environment with uv while it starts Python; with uv told to use
# the system's Pythons (UV_PYTHON_PREFERENCE=system or only-system, e.g. where uv cannot download
# one) its search for them asks which Python it would start, which builds the environment again,
# and so on until "C stack usage ... is too close to the limit" (minutes later; it then goes on).
# Built first through the exported uv_run_tool() (the same uv command, so the same cached
# environment) and chosen by path, Python starts at once. Gated on the versions that recurse.
prebuild_ephemeral_python <- function() {
  preference <- Sys.getenv("UV_PYTHON_PREFERENCE")
  if (utils::packageVersion("reticulate") > "1.46.0" || !preference %in% c("system", "only-system")) {
    return(invisible())
  }
  requirements <- reticulate::py_require()
  python <- reticulate::uv_run_tool("python", c("-c", shQuote("import sys; print(sys.executable)")),
                                    with = requirements$packages, python_version = requirements$python_version,
                                    exclude_newer = requirements$exclude_newer, stdout = TRUE)
  python <- utils::tail(python, 1)
  if (length(python) == 1 && file.exists(python)) reticulate::use_python(python, required = TRUE)
  invisible()
}

first_line <- function(text) sub("\n.*$", "", trimws(text))

# One sentence and the one thing that fixes it, whoever started Python. In reticulate's own
# environment, started before kerasdist was loaded (keras3 ran first), kerasdist adds itself
# (py_require() after start, reticulate >= 1.45) rather than asking for a restart.
require_kerasdist_python <- function(started_by_others, chosen = list(python = NULL, by = NULL)) {
  missing <- missing_modules()
  if (length(missing) == 0) return(invisible())
  config <- reticulate::py_config()
  if (started_by_others && isTRUE(config$ephemeral)) {
    add_to_running_python(python_requirements(getOption("kerasdist.storage")))
    if (length(missing <- missing_modules()) == 0) return(invisible())
  }
  python <- config$python
  modules <- paste0("'", missing, "'", collapse = " and ")
  venv <- virtualenv_of(python)
  setup_error(if (isTRUE(config$ephemeral) && is.null(python_requirements())) {
    paste0("This installation of the kerasdist R package carries no Python package (its installer copies it ",
           "from the source's python/ folder): reinstall kerasdist from its source tarball.")
  } else if (isTRUE(config$ephemeral)) {
    sprintf(paste0("reticulate's Python environment at %s was started before kerasdist could add itself and ",
                   "has no %s module: restart R and call library(kerasdist) before anything uses Python."),
            python, modules)
  } else if (!is.null(venv)) {
    sprintf(paste0("%s Python at %s%s has no %s module: run `kerasdist::install_kerasdist(\"%s\")` once, ",
                   "then restart R."),
            if (started_by_others) "reticulate already runs the" else "The", python,
            if (!is.null(chosen$by)) sprintf(" (from %s)", chosen$by) else
              if (started_by_others) " (started by keras3 or another package before kerasdist), which" else "",
            modules, venv)
  } else {
    sprintf(paste0("%s Python at %s%s has no %s module: restart R without %s choosing it, and ",
                   "kerasdist sets up its own."),
            if (started_by_others) "reticulate already runs the" else "The", python,
            if (started_by_others) " (started by keras3 or another package before kerasdist), which" else "",
            modules, if (is.null(chosen$by)) "RETICULATE_PYTHON or reticulate::use_python()" else chosen$by)
  })
}

missing_modules <- function() Filter(Negate(python_module_installed), c("tensorflow", "kerasdist"))

# The virtualenv a Python belongs to (the folder with pyvenv.cfg), or NULL.
virtualenv_of <- function(python) {
  dir <- dirname(dirname(python))
  if (file.exists(file.path(dir, "pyvenv.cfg"))) dir else NULL
}

# After Python has started, reticulate (>= 1.45) can add requirements to its own environment: it
# builds an environment with them all and puts it on top of the running one. Elsewhere (an older
# reticulate, or a Python chosen by path) the requirements are left for the next session.
add_to_running_python <- function(requirements) {
  if (length(requirements) == 0) return(FALSE)
  if (utils::packageVersion("reticulate") < "1.45" || !isTRUE(reticulate::py_config()$ephemeral)) {
    return(FALSE)
  }
  message("kerasdist: adding ", paste(sub("@.*$", "", requirements), collapse = ", "),
          " to reticulate's Python environment")
  tryCatch({
    reticulate::py_require(requirements)
    TRUE
  }, error = function(err) FALSE, warning = function(w) FALSE)
}

# Without importing it (py_module_available() imports, which would start TensorFlow too early).
python_module_installed <- function(module) {
  !is.null(reticulate::import("importlib.util")$find_spec(module))
}

python_module_imported <- function(module) {
  reticulate::py_to_r(reticulate::import("sys", convert = FALSE)$modules$`__contains__`(module))
}

python_environ <- function() reticulate::import("os", convert = FALSE)$environ

# Whether Python's keras has been imported (after which keras3's load hook has started
# TensorFlow's devices).
keras_imported <- function() {
  reticulate::py_available(initialize = FALSE) && python_module_imported("keras")
}

setup_error <- function(message) {
  stop(structure(
    class = c("kerasdist_setup_error", "kerasdist_error", "error", "condition"),
    list(message = message, call = NULL)
  ))
}

# Call a Python function with `...` as its arguments (`py_args()`); a Python exception becomes an
# R error of class `kerasdist_error` (plus e.g. `kerasdist_ValueError`, the exception's class name
# as reticulate's condition carries it) whose message is the exception's own text (`str()`), and
# kerasdist's Python warnings become R warnings.
call_python <- function(fun, ..., call = sys.call(-1)) {
  force(call)
  on.exit(run_held_keras_load_hooks(), add = TRUE)
  force(fun)  # usually kerasdist_module()$..., which imports kerasdist (and the bridge) on first use
  kerasdist_module()
  args <- c(list(fun), py_args(list(...)))
  result <- tryCatch(do.call(.kerasdist$bridge$call_capturing_warnings, args), error = function(err) {
    if (inherits(err, "kerasdist_error")) stop(err)
    if (inherits(err, "python.builtin.SystemExit")) exited(err, call)
    kerasdist_abort(simplify_graph_error(python_error_message(err)), python_error_type(err), call)
  })
  for (message in unlist(result[[2]])) warning(warningCondition(message, call = call, class = "kerasdist_warning"))
  result[[1]]
}

# call_python() with the calling R function's own arguments, each by its name: for a wrapper whose
# arguments are its Python twin's keywords, with the same defaults (tests/python/test_signatures.py
# ties them). `renamed` gives the Python name of an R argument that must differ
# (`c(repeat_epochs = "repeat")`: `repeat` is reserved in R). An argument given no value is left
# out, so Python names it.
call_python_forwarding <- function(fun, renamed = character(), env = parent.frame(), call = sys.call(-1)) {
  force(call)
  own <- setdiff(names(formals(sys.function(sys.parent()))), "...")
  args <- Filter(function(value) !identical(value, quote(expr = )), mget(own, envir = env))
  at <- names(args) %in% names(renamed)
  names(args)[at] <- renamed[names(args)[at]]
  do.call(call_python, c(list(fun), args, list(call = call)), quote = TRUE)  # quote: `call` is not run again
}

# A Python exception's class name, from the class reticulate gives its condition (e.g.
# "tensorflow.python.framework.errors_impl.InvalidArgumentError"); "Error" for an R error.
python_error_type <- function(err) {
  if (!inherits(err, "python.builtin.BaseException")) return("Error")
  sub("^.*\\.", "", class(err)[[1]])
}

python_error_message <- function(err) {
  if (!inherits(err, "python.builtin.BaseException")) return(conditionMessage(err))
  sub("\\s+$", "", reticulate::py_str(err))
}

# Python ended the fit with a SystemExit: `PreemptedExit` (status 75, a SIGTERM saved a checkpoint,
# which it names) or `PeerLostExit` (76, another worker of the cluster disappeared; nothing saved,
# the newest checkpoint intact; it names the peer). Rscript exits with that status, as Python does,
# so a launcher or cluster manager restarts it; an interactive session (or
# `kerasdist.exit_on_preemption = FALSE`) gets a `kerasdist_preempted` or `kerasdist_peer_lost`
# condition instead, with the exception's message and fields.
exited <- function(exit, call) {
  status <- suppressWarnings(as.integer(exit$code))
  if (getOption("kerasdist.exit_on_preemption", !interactive())) quit(save = "no", status = status)
  fields <- if (inherits(exit, "kerasdist.preemption.exit.PeerLostExit")) {
    list(class = "kerasdist_peer_lost", peer = exit$peer)
  } else if (inherits(exit, "kerasdist.preemption.exit.PreemptedExit")) {
    list(class = "kerasdist_preempted", checkpoint = exit$checkpoint, global_step = exit$global_step)
  } else {
    list(class = "kerasdist_SystemExit")
  }
  # (`exit$message` would be reticulate's R condition message, not the Python attribute)
  message <- if (reticulate::py_has_attr(exit, "message")) {
    reticulate::py_to_r(reticulate::py_get_attr(exit, "message"))
  } else {
    python_error_message(exit)
  }
  stop(structure(class = c(fields$class, "kerasdist_error", "error", "condition"),
                 c(list(message = message), fields[names(fields) != "class"], list(call = call, status = status))))
}

# An R closure (not a Python callable seen through reticulate): TensorFlow would call it on one of
# its own threads, where R code cannot run.
is_r_function <- function(f) is.function(f) && !inherits(f, "python.builtin.object")

# Stop with the condition a Python exception of `type` becomes in R: class
# `kerasdist_<type>` and `kerasdist_error`, the message without a traceback.
kerasdist_abort <- function(message, type = "ValueError", call = sys.call(-1)) {
  stop(structure(
    class = c(paste0("kerasdist_", type), "kerasdist_error", "error", "condition"),
    list(message = message, call = call, python_type = type)
  ))
}

# TensorFlow's runtime errors ("Graph execution error: ... defined at (most recent call last):
# File ...") become the failing op and the cause; the frames stay in reticulate::py_last_error().
simplify_graph_error <- function(message) {
  if (!startsWith(message, "Graph execution error:")) return(message)
  node <- regmatches(message, regexpr("\\{\\{node [^}]+\\}\\}", message))
  lines <- trimws(strsplit(message, "\n", fixed = TRUE)[[1]])
  frame <- "^(File |Detected at node|Graph execution error:|<\\.\\.\\.truncated|\\[\\[\\{\\{node)"
  cause <- lines[nzchar(lines) & !grepl(frame, lines)]
  sprintf("TensorFlow failed in the training step%s: %s (the full traceback: reticulate::py_last_error())",
          if (length(node)) sprintf(" at op '%s'", sub("^\\{\\{node (.*)\\}\\}$", "\\1", node)) else "",
          paste(cause, collapse = " "))
}

# The one R-to-Python converter: how a named argument of call_python() crosses, by its name
# (PY_CONVERSIONS); any other named argument is a count (`epochs = 5`, an R double, becomes an
# integer, since kerasdist refuses a float where it counts). Unnamed arguments pass as they are.
PY_CONVERSIONS <- c(
  x = "data", data = "data", per_example = "data", per_example_loss = "data", sample_weight = "data",
  validation_data = "data", y = "labels", devices = "list", gpus = "list", strategies = "list",
  environ = "dict", env = "dict", tf_config = "tf_config", callbacks = "callbacks",
  dataset_args = "counts", features = "shapes"
)

py_args <- function(args) {
  named <- if (is.null(names(args))) rep("", length(args)) else names(args)
  for (i in which(nzchar(named))) {
    as <- PY_CONVERSIONS[named[[i]]]
    value <- as_py(args[[i]], if (is.na(as)) "count" else as)
    if (is.null(value)) args[i] <- list(NULL) else args[[i]] <- value
  }
  args
}

# `x` as Python takes it, converted `as`:
# - "count": a whole R number becomes an integer; anything else passes unchanged;
# - "counts", "shapes": each element a count, or a shape (a list of integers);
# - "data": R data as the Python core reads it: vectors become 1-d arrays (reticulate would make
#   lists of them, or scalars of length-1 vectors), lists keep their names, matrices, arrays, data
#   frames, file patterns and Python objects pass as they are (reticulate keeps an array's element
#   [i, j] at [i - 1, j - 1], whatever its memory order); "labels" as "data", but one string (a
#   label column's name) passes as it is;
# - "list": a character vector of any length becomes a list (anything else is a "count": `devices`
#   names devices in select_strategy() and counts them in bench_strategies()); "dict": a named list or vector, `dict()` when
#   empty; "callbacks": one callback or a list of them (a Python object is an environment, which
#   as.list() would take apart); "tf_config": a TF_CONFIG given as a nested R list gets its task
#   index as an integer (JSON text and NULL pass unchanged).
as_py <- function(x, as) {
  if (is.null(x)) return(NULL)
  switch(as,
    count = if (is.numeric(x) && length(x) == 1 && !is.na(x) && x == round(x)) as.integer(x) else x,
    counts = lapply(x, as_py, "count"),
    shapes = lapply(x, function(shape) {
      if (inherits(shape, "python.builtin.object")) shape else as.list(as.integer(shape))
    }),
    data = {
      if (inherits(x, "python.builtin.object") || is.data.frame(x)) x
      else if (is.character(x)) as.list(x)
      else if (is.list(x)) lapply(x, as_py, "data")
      else if (is.atomic(x) && is.null(dim(x))) array(x, dim = length(x))
      else x
    },
    labels = if (is.character(x) && length(x) == 1) x else as_py(x, "data"),
    list = if (is.character(x)) as.list(x) else as_py(x, "count"),  # bench_strategies' `devices` is a count
    dict = if (length(x) == 0) reticulate::dict() else as.list(x),
    callbacks = if (is.list(x)) x else list(x),
    tf_config = {
      if (is.list(x) && is.list(x$task) && !is.null(x$task$index)) x$task$index <- as_py(x$task$index, "count")
      x
    },
    stop("unknown conversion: ", as)
  )
}

is_count <- function(x) is.integer(x) && length(x) == 1 && !is.na(x) && x >= 1L

# A Python History as keras3's `keras_training_history` (what keras3's fit() returns), so that
# print(), plot() and as.data.frame() work; `model` is the trained model.
as_training_history <- function(history) {
  metrics <- lapply(reticulate::py_to_r(history$history), function(values) as.numeric(unlist(values)))
  params <- history$params
  params <- if (is.null(params)) list() else reticulate::py_to_r(params)
  params$epochs <- if (length(metrics) == 0) 0L else length(metrics[[1]])
  structure(class = "keras_training_history", list(params = params, metrics = metrics, model = history$model))
}

# A data frame of Python's columns: (name, R type, values) each, None where missing; type "time"
# is seconds since 1970, which becomes a POSIXct in UTC.
columns_to_data_frame <- function(columns) {
  frame <- lapply(columns, function(column) {
    values <- lapply(column[[3]], function(v) if (is.null(v)) NA else v)
    if (identical(column[[2]], "time")) {
      return(as.POSIXct(vapply(values, as.numeric, numeric(1)), origin = "1970-01-01", tz = "UTC"))
    }
    vapply(values, function(v) as.vector(v, column[[2]]), vector(column[[2]], 1), USE.NAMES = FALSE)
  })
  names(frame) <- vapply(columns, function(column) column[[1]], character(1))
  frame <- as.data.frame(frame, stringsAsFactors = FALSE)
  rownames(frame) <- NULL
  frame
}

# A Python dataclass record (CheckpointInfo, ClusterInfo, DatasetInfo, ...) as a named R list:
# its fields in their order, then the computed `properties` named (e.g. "is_chief"). None becomes
# NULL, whole numbers become integers and a tuple of strings (an empty one too) a character
# vector; other values are as reticulate converts them.
py_record_to_r <- function(record, properties = character()) {
  fields <- reticulate::import("dataclasses", convert = FALSE)$asdict(record)
  names <- reticulate::py_to_r(reticulate::import_builtins(convert = FALSE)$list(fields))
  values <- c(lapply(names, function(name) reticulate::py_get_item(fields, name)),
              lapply(properties, function(name) reticulate::py_get_attr(record, name)))
  values <- lapply(values, py_field_to_r)
  names(values) <- c(names, properties)
  values
}

py_field_to_r <- function(value) {
  tuple <- inherits(value, "python.builtin.tuple")
  value <- reticulate::py_to_r(value)
  if (is.numeric(value) && all(value == round(value))) return(as.integer(value))
  if (tuple && all(vapply(value, is.character, logical(1)))) return(as.character(unlist(value)))
  value
}
