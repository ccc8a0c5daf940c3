# Finding the Python that holds kerasdist, and turning Python errors into readable R conditions.

.kerasdist <- new.env(parent = emptyenv())

#' The Python interpreter kerasdist uses
#'
#' kerasdist runs on a Python environment with TensorFlow, Keras 3 and the
#' `kerasdist` module. It is found, in this order, from: the option
#' `kerasdist.python`; the environment variable `KERASDIST_PYTHON`; a `.venv`
#' in the working directory or one of its parents (the one `make demo` creates);
#' `RETICULATE_PYTHON`; the `"r-keras"` virtualenv that [install_kerasdist()]
#' (and `keras3::install_keras()`) create. If reticulate has already started
#' Python (for example because keras3 ran first), that Python is used.
#'
#' @returns The path of the Python executable, or `NULL` if none was found.
#' @family setup
#' @examples
#' kerasdist_python()
#' @export
kerasdist_python <- function() {
  if (reticulate::py_available(initialize = FALSE)) {
    return(reticulate::py_config()$python)
  }
  candidates <- c(
    getOption("kerasdist.python", ""),
    Sys.getenv("KERASDIST_PYTHON"),
    find_project_venv(getwd()),
    Sys.getenv("RETICULATE_PYTHON"),
    shared_keras_venv()
  )
  found <- candidates[nzchar(candidates) & file.exists(candidates)]
  # Not normalizePath(): it would resolve the venv's symlink to the base interpreter.
  if (length(found) == 0) NULL else path.expand(found[[1]])
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

# On load, point reticulate at kerasdist's Python (without starting it), so that a user's own
# reticulate::import("keras") before any kerasdist call gets the same interpreter; and have
# kerasdist's Python imported with TensorFlow, whoever imports it.
.onLoad <- function(libname, pkgname) {
  if (!reticulate::py_available(initialize = FALSE)) {
    python <- kerasdist_python()
    if (!is.null(python)) prefer_python(python)
  }
  reticulate::py_register_load_hook("tensorflow", import_with_tensorflow)
}

# Importing kerasdist fixes Keras 3's multi-worker fit and explains a multi-worker strategy made
# too late (python/kerasdist/compat.py), so code that makes its own strategy with
# tensorflow::tf$distribute and trains with keras3's fit() needs only library(kerasdist). Quiet:
# a Python without kerasdist is reported by the first kerasdist call, not by TensorFlow's import.
import_with_tensorflow <- function() {
  if (!is.null(.kerasdist$module) || isTRUE(.kerasdist$importing)) return(invisible())
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
    activate_python()
    require_kerasdist_python(started_by_others)
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

activate_python <- function() {
  if (reticulate::py_available(initialize = FALSE)) return(invisible())
  python <- kerasdist_python()
  if (is.null(python)) {
    setup_error(paste0(
      "No Python environment for kerasdist was found: run `make demo` in the kerasdist ",
      "checkout, or set options(kerasdist.python = \"/path/to/python\")."
    ))
  }
  Sys.setenv(RETICULATE_PYTHON = python)
  reticulate::use_python(python, required = TRUE)
  if (!reticulate::py_available(initialize = TRUE)) {
    setup_error(sprintf("Python at %s could not be started: run `make demo` to rebuild .venv.", python))
  }
}

# One sentence and the one call that fixes it, whoever started Python.
require_kerasdist_python <- function(started_by_others) {
  missing <- Filter(Negate(python_module_installed), c("tensorflow", "kerasdist"))
  if (length(missing) == 0) return(invisible())
  python <- reticulate::py_config()$python
  modules <- paste0("'", missing, "'", collapse = " and ")
  setup_error(if (started_by_others) {
    sprintf(paste0(
      "reticulate already runs the Python at %s (started by keras3 or another package before kerasdist), ",
      "which has no %s module: run `kerasdist::install_kerasdist()` once, then restart R."
    ), python, modules)
  } else {
    sprintf(paste0(
      "The Python at %s has no %s module: run `kerasdist::install_kerasdist()` once (or `make demo` ",
      "in the kerasdist checkout), then restart R."
    ), python, modules)
  })
}

# Without importing it (py_module_available() imports, which would start TensorFlow too early).
python_module_installed <- function(module) {
  !is.null(reticulate::import("importlib.util")$find_spec(module))
}

python_environ <- function() reticulate::import("os", convert = FALSE)$environ

# Whether Python's keras has been imported (after which keras3's load hook has started
# TensorFlow's devices).
keras_imported <- function() {
  reticulate::py_available(initialize = FALSE) &&
    reticulate::py_to_r(reticulate::import("sys", convert = FALSE)$modules$`__contains__`("keras"))
}

setup_error <- function(message) {
  stop(structure(
    class = c("kerasdist_setup_error", "kerasdist_error", "error", "condition"),
    list(message = message, call = NULL)
  ))
}

# Call a Python function with `...` as its arguments (`py_args()`); a Python exception becomes an
# R error of class `kerasdist_error` (plus e.g. `kerasdist_ValueError`) whose message is the
# exception's own text, without the traceback, and kerasdist's Python warnings become R warnings.
call_python <- function(fun, ..., call = sys.call(-1)) {
  force(call)
  on.exit(run_held_keras_load_hooks(), add = TRUE)
  force(fun)  # imports kerasdist (and the bridge) on first use
  args <- c(list(fun), py_args(list(...)))
  result <- tryCatch(do.call(.kerasdist$bridge$call_capturing_warnings, args), error = function(err) {
    if (inherits(err, "kerasdist_error")) stop(err)
    if (inherits(err, "python.builtin.SystemExit")) exited(err, call)
    parsed <- parse_python_error(conditionMessage(err))
    kerasdist_abort(parsed$message, parsed$type, call)
  })
  for (message in unlist(result[[2]])) warning(warningCondition(message, call = call, class = "kerasdist_warning"))
  result[[1]]
}

# Arguments as Python takes them: a named count given as an R number (`epochs = 5`, a double)
# becomes an integer, since kerasdist refuses a float where it counts. Data arguments keep the
# user's own values.
DATA_ARGUMENTS <- c("x", "y", "data", "per_example", "sample_weight", "validation_data")

py_args <- function(args) {
  named <- if (is.null(names(args))) rep("", length(args)) else names(args)
  counts <- nzchar(named) & !named %in% DATA_ARGUMENTS
  args[counts] <- lapply(args[counts], as_py_int)
  args
}

# Python ended the fit with a SystemExit: `PreemptedExit` (status 75, a SIGTERM saved a checkpoint,
# which it names) or `PeerLostExit` (76, another worker of the cluster disappeared; nothing saved,
# the newest checkpoint intact; it names the peer). Rscript exits with that status, as Python does,
# so a launcher or cluster manager restarts it; an interactive session (or
# `kerasdist.exit_on_preemption = FALSE`) gets a `kerasdist_preempted` or `kerasdist_peer_lost`
# condition instead.
exited <- function(exit, call) {
  status <- suppressWarnings(as.integer(exit$code))
  if (getOption("kerasdist.exit_on_preemption", !interactive())) quit(save = "no", status = status)
  fields <- if (reticulate::py_has_attr(exit, "peer")) peer_lost_fields(exit) else preempted_fields(exit)
  stop(structure(class = c(fields$class, "kerasdist_error", "error", "condition"),
                 c(fields[names(fields) != "class"], list(call = call, status = status))))
}

preempted_fields <- function(exit) {
  checkpoint <- if (reticulate::py_has_attr(exit, "checkpoint")) exit$checkpoint
  list(class = "kerasdist_preempted",
       message = sprintf("Preempted (SIGTERM): saved checkpoint %s; run the same call again to continue.",
                         if (is.null(checkpoint)) "(none)" else checkpoint),
       checkpoint = checkpoint,
       global_step = if (reticulate::py_has_attr(exit, "global_step")) exit$global_step)
}

peer_lost_fields <- function(exit) {
  peer <- exit$peer
  list(class = "kerasdist_peer_lost",
       message = sprintf("%s of this multi-worker cluster was lost (%s); the newest checkpoint is intact: restart the group to resume.",
                         if (is.null(peer)) "A peer" else peer, exit$detail),
       peer = peer)
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

parse_python_error <- function(message) {
  message <- sub("\n+(Detailed traceback|Run `reticulate::py_last_error|See `reticulate::py_last_error).*$", "", message)
  message <- sub("\\s+$", "", message)
  type <- "Error"
  pattern <- "^([A-Za-z_][A-Za-z0-9_.]*(Error|Exception|Interrupt|Exit)): "
  if (grepl(pattern, message)) {
    type <- sub("^.*\\.", "", sub(paste0(pattern, ".*$"), "\\1", message))
    message <- sub(pattern, "", message)
  }
  list(type = type, message = simplify_graph_error(message))
}

# R-to-Python argument helpers: vectors of any length become lists, whole doubles become integers.
as_py_list <- function(x) if (is.null(x)) NULL else as.list(x)

# One callback or a list of them (a Python object is an environment, which as.list() would take apart).
as_py_callbacks <- function(callbacks) {
  if (is.null(callbacks) || is.list(callbacks)) callbacks else list(callbacks)
}

as_py_dict <- function(x) {
  if (is.null(x)) NULL else if (length(x) == 0) reticulate::dict() else as.list(x)
}

is_count <- function(x) is.integer(x) && length(x) == 1 && !is.na(x) && x >= 1L

as_py_int <- function(x) {
  if (is.numeric(x) && length(x) == 1 && !is.na(x) && x == round(x)) as.integer(x) else x
}

# A TF_CONFIG given as a nested R list: its task index as an integer (R's `index = 0` is a double,
# which Python refuses); JSON text and NULL pass unchanged.
as_py_tf_config <- function(tf_config) {
  if (is.list(tf_config) && is.list(tf_config$task) && !is.null(tf_config$task$index)) {
    tf_config$task$index <- as_py_int(tf_config$task$index)
  }
  tf_config
}

# A Python History as keras3's `keras_training_history` (what keras3's fit() returns), so that
# print(), plot() and as.data.frame() work; `model` is the trained model.
as_training_history <- function(history) {
  metrics <- lapply(reticulate::py_to_r(history$history), function(values) as.numeric(unlist(values)))
  params <- history$params
  params <- if (is.null(params)) list() else reticulate::py_to_r(params)
  params$epochs <- if (length(metrics) == 0) 0L else length(metrics[[1]])
  structure(class = "keras_training_history", list(params = params, metrics = metrics, model = history$model))
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
