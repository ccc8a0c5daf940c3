library(testthat)
library(keras3)
library(kerasdist)

# tools/test.sh asks for every test's time as JUnit XML (KERASDIST_TEST_TIMES: the file).
times <- Sys.getenv("KERASDIST_TEST_TIMES")
reporter <- if (nzchar(times)) {
  MultiReporter$new(list(CheckReporter$new(), JunitReporter$new(file = times)))
} else {
  check_reporter()
}
test_check("kerasdist", reporter = reporter)
