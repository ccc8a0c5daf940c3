# The strategy rows of tests/cases, the same ones pytest runs from Python.

for (row in case_rows("strategy")) {
  local({
    row <- row
    test_that(paste("case:", row$id), {
      skip_if_no_kerasdist()
      fun <- getExportedValue("kerasdist", row[["function"]])
      if (!is.null(row$error)) {
        err <- expect_error(do.call(fun, row$args), class = "kerasdist_error")
        expect_true(grepl(row$error, conditionMessage(err), fixed = TRUE), label = conditionMessage(err))
        expect_false(grepl("Traceback|File \"", conditionMessage(err)))
        return()
      }
      plan <- do.call(fun, row$args)
      for (name in names(row$expect)) {
        expected <- row$expect[[name]]
        actual <- field_of(plan, name)
        if (name == "reason") {
          expect_true(grepl(expected, actual, fixed = TRUE), label = actual)
        } else if (length(expected) == 0) {
          expect_length(actual, 0)
        } else {
          expect_identical(unlist(actual), unlist(expected), label = name)
        }
      }
    })
  })
}
