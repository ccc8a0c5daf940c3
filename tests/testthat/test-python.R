# R only forwards (R/python.R): a Python exception's class comes from the condition, its message
# from str(); the preempted and peer-lost messages from Python; the one converter, as_py().

test_that("a Python exception becomes kerasdist_<its class>, whatever its message says", {
  skip_if_no_kerasdist()
  raise <- reticulate::py_run_string(paste(
    "class StoreTimeout(Exception): pass",
    "def boom(kind):",
    "    if kind == 1: raise StoreTimeout('ValueError: not really a ValueError')",
    "    if kind == 2: raise KeyError('missing')",
    "    import json; json.loads('{')",
    sep = "\n"), convert = FALSE)$boom
  err <- expect_error(kerasdist:::call_python(raise, 1L), class = "kerasdist_StoreTimeout")
  expect_s3_class(err, "kerasdist_error")
  expect_identical(conditionMessage(err), "ValueError: not really a ValueError")
  expect_identical(err$python_type, "StoreTimeout")
  err <- expect_error(kerasdist:::call_python(raise, 2L), class = "kerasdist_KeyError")
  expect_identical(conditionMessage(err), "'missing'")
  err <- expect_error(kerasdist:::call_python(raise, 3L), class = "kerasdist_JSONDecodeError")
  expect_match(conditionMessage(err), "^Expecting property name")
  expect_false(grepl("py_last_error|Traceback", conditionMessage(err)))
})

test_that("the preempted condition's message and fields are PreemptedExit's", {
  skip_if_no_kerasdist()
  withr::local_options(kerasdist.exit_on_preemption = FALSE)
  exit <- reticulate::import("kerasdist")$PreemptedExit("/runs/ckpt-12", 12L)
  raise <- reticulate::py_run_string("def fit(exit):\n    raise exit", convert = FALSE)$fit
  err <- expect_error(kerasdist:::call_python(raise, exit), class = "kerasdist_preempted")
  expect_identical(conditionMessage(err), reticulate::py_to_r(reticulate::py_get_attr(exit, "message")))
  expect_identical(conditionMessage(err), "Preempted (SIGTERM): saved checkpoint /runs/ckpt-12; run the same call again to continue.")
  expect_identical(c(err$checkpoint, err$status), c("/runs/ckpt-12", "75"))
  expect_identical(err$global_step, 12L)
})

test_that("kerasdist_demo() leaves the epochs check to Python: a readable condition naming it, nothing done", {
  skip_if_no_kerasdist()
  run_dir <- file.path(withr::local_tempdir(), "demo")
  expect_error(kerasdist_demo(run_dir, epochs = 0), "epochs must be an integer >= 1, got 0", class = "kerasdist_ValueError")
  expect_error(kerasdist_demo(run_dir, epochs = 1.5), "epochs must be an integer >= 1, got 1.5", class = "kerasdist_ValueError")
  err <- expect_error(kerasdist_demo(run_dir, epochs = "six"), class = "kerasdist_ValueError")
  expect_match(deparse(conditionCall(err))[1], "^kerasdist_demo\\(")
  expect_false(dir.exists(run_dir))
})

test_that("a strategy plan prints Python's text", {
  skip_if_no_kerasdist()
  plan <- plan_strategy(gpus = c("/gpu:0", "/gpu:1"), environ = list(), tpu = FALSE)
  expect_identical(format(plan), reticulate::py_str(kerasdist:::kerasdist_module()$plan_strategy(
    gpus = list("/gpu:0", "/gpu:1"), environ = reticulate::dict(), tpu = FALSE)))
  expect_output(print(plan), "strategy:  mirrored\nwhy:       .*\ndevices:   /gpu:0, /gpu:1")
  expect_output(print(plan_strategy("default", environ = list(), tpu = FALSE)), "devices:   (strategy's choice)", fixed = TRUE)
})

test_that("as_py() converts as the scattered helpers did", {
  as_py <- kerasdist:::as_py
  expect_identical(as_py(5, "count"), 5L)
  expect_identical(as_py(1.5, "count"), 1.5)
  expect_identical(as_py("a", "count"), "a")
  expect_null(as_py(NULL, "data"))
  expect_identical(as_py(c(1, 2), "data"), array(c(1, 2), dim = 2L))
  expect_identical(as_py(c("a*.csv", "b*.csv"), "data"), list("a*.csv", "b*.csv"))
  expect_identical(as_py(list(a = 1, b = c(2, 3)), "data"), list(a = array(1, dim = 1L), b = array(c(2, 3), dim = 2L)))
  m <- matrix(1:4, 2)
  expect_identical(as_py(m, "data"), m)
  expect_identical(as_py("label", "labels"), "label")
  expect_identical(as_py(c(0L, 1L), "labels"), array(c(0L, 1L), dim = 2L))
  expect_identical(as_py(c("/gpu:0", "/gpu:1"), "list"), list("/gpu:0", "/gpu:1"))
  expect_identical(as_py(2, "list"), 2L)  # bench_strategies(devices = 2): a count, not a list
  expect_identical(as_py(list(A = "1"), "dict"), list(A = "1"))
  expect_identical(as_py(list(cluster = list(worker = "a:1"), task = list(type = "worker", index = 0)), "tf_config")$task$index, 0L)
  expect_identical(as_py('{"task": {}}', "tf_config"), '{"task": {}}')
  expect_identical(as_py(list(steps = 2, name = "x"), "counts"), list(steps = 2L, name = "x"))
  expect_identical(as_py(list(a = c(8, 8)), "shapes"), list(a = list(8L, 8L)))
  callback <- new.env()
  expect_identical(as_py(callback, "callbacks"), list(callback))
  expect_identical(kerasdist:::py_args(list(1, epochs = 2, y = "label", x = c(1, 2), devices = "a", none = NULL)),
                   list(1, epochs = 2L, y = "label", x = array(c(1, 2), dim = 2L), devices = list("a"), none = NULL))
})
