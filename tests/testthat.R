library(testthat)
library(keras3)
library(kerasdist)

test_check("kerasdist")
