library(testthat)
library(kerasdist)

test_check("kerasdist")
