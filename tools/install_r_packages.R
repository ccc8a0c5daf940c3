# Installs the R packages Debian lacks (keras3, tensorflow, a current reticulate and what they need;
# tfdatasets, the tf.data pipelines keras3's guides build, for the tests and vignettes)
# from the repositories named in KERASDIST_R_REPOS (space- or comma-separated; CRAN by default)
# into the first R library (KERASDIST_R_LIB to choose another). Skips what is installed already.
# Usage: Rscript tools/install_r_packages.R

wanted <- c(reticulate = "1.42", tensorflow = "2.16", keras3 = "1.5", tfdatasets = "2.18")

repos <- strsplit(Sys.getenv("KERASDIST_R_REPOS", "https://cloud.r-project.org"), "[ ,]+")[[1]]
repos <- repos[nzchar(repos)]
lib <- Sys.getenv("KERASDIST_R_LIB", .libPaths()[1])

outdated <- function(package, minimum) {
  installed <- tryCatch(utils::packageVersion(package, lib.loc = .libPaths()), error = function(e) NULL)
  is.null(installed) || installed < minimum
}

missing <- names(wanted)[mapply(outdated, names(wanted), wanted)]
if (length(missing) == 0) quit(status = 0)

cat(sprintf("setup: installing R packages %s from %s into %s\n",
            paste(missing, collapse = " "), paste(repos, collapse = " "), lib))
dir.create(lib, recursive = TRUE, showWarnings = FALSE)
options(warn = 1)
utils::install.packages(missing, lib = lib, repos = repos, quiet = TRUE,
                        Ncpus = max(1L, parallel::detectCores()))

still_missing <- names(wanted)[mapply(outdated, names(wanted), wanted)]
if (length(still_missing) > 0) {
  message(sprintf(
    "setup: could not install %s (>= %s) from %s. Set KERASDIST_R_REPOS to a CRAN mirror that has them.",
    paste(still_missing, collapse = ", "), paste(wanted[still_missing], collapse = ", "),
    paste(repos, collapse = " ")
  ))
  quit(status = 1)
}
