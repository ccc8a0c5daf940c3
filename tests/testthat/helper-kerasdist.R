# Shared helpers: the behaviour tables in tests/cases, and a guard for machines without Python.

# tests/, the folder around tests/testthat: the source tree's, or R CMD check's copy of it.
tests_dir <- function() {
  candidates <- c(test_path(".."), test_path("..", "..", "tests"))
  found <- candidates[dir.exists(file.path(candidates, "cases"))]
  if (length(found) == 0) stop("tests/cases not found next to tests/testthat")
  found[[1]]
}

cases_dir <- function() file.path(tests_dir(), "cases")

# A module of tests/kerasdist_testing (the object-store test servers, which the package does not
# ship), e.g. test_server_module("s3_test_server").
test_server_module <- function(name) {
  reticulate::import_from_path(paste0("kerasdist_testing.", name), path = normalizePath(tests_dir()))
}

case_rows <- function(name) {
  path <- file.path(cases_dir(), paste0(name, ".json"))
  jsonlite::fromJSON(path, simplifyVector = FALSE)$rows
}

# `cluster.num_ps` -> x$cluster$num_ps
field_of <- function(x, dotted) {
  for (part in strsplit(dotted, ".", fixed = TRUE)[[1]]) x <- x[[part]]
  x
}

# Skip only where the Python side cannot exist; `make test` sets KERASDIST_REQUIRE_PYTHON=1 so
# that a missing environment fails instead of skipping.
skip_if_no_kerasdist <- function() {
  if (identical(Sys.getenv("KERASDIST_REQUIRE_PYTHON"), "1")) return(invisible())
  if (is.null(kerasdist_python())) skip("no Python environment for kerasdist")
}

# Run an R function in a fresh R process (TensorFlow can set up devices once per process).
# The child has only base packages attached: `fun` calls library(keras3) and library(kerasdist)
# itself, in the order it needs (simulate_devices() must come before any keras3 model).
in_fresh_r <- function(fun, ...) {
  callr::r(fun, args = list(...), libpath = .libPaths(), env = c(callr::rcmd_safe_env(), TF_CPP_MIN_LOG_LEVEL = "2"))
}

# Run an R function in the one R session, apart from this one, that the tests needing 2 simulated
# CPU devices share: each such fresh process would pay R's and TensorFlow's start-up again. `fun`,
# as for in_fresh_r(), attaches keras3 and kerasdist and calls simulate_devices(2) itself: the
# first call splits the CPU, later ones are no-ops.
in_two_device_r <- function(fun, ...) two_device_session()$run(fun, args = list(...))

two_device_session <- local({
  session <- NULL
  function() {
    if (is.null(session) || !session$is_alive()) {
      env <- c(callr::rcmd_safe_env(), TF_CPP_MIN_LOG_LEVEL = "2")
      session <<- callr::r_session$new(callr::r_session_options(libpath = .libPaths(), env = env))
      withr::defer(session$close(), testthat::teardown_env())  # ended with the test run, never left behind
    }
    session
  }
})

# Launch the test script scripts/<name>, its arguments `...` after it, as 2 workers on this host
# (kerasdist's launch()) and expect every worker to succeed; returns the script's path (to run it
# again as one process).
launch_r_script <- function(name, ...) {
  script <- normalizePath(test_path("scripts", name))
  result <- launch(c(script, ...), num_workers = 2L, grace_period = 2, timeout = 240)
  expect_true(result$ok)
  invisible(script)
}
