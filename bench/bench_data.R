# Bringing a large R double matrix into a dataset, against the same from Python.
#
# Times make_dataset() on an n x p double matrix (default 1e6 x 100, 800 MB) up to the first
# batch, in R (through reticulate) and in a separate Python process on a NumPy array of the same
# size, and reads each process's memory from /proc/self/status: VmRSS just before the call and
# VmHWM (peak resident) after it. TensorFlow and kerasdist are loaded first in both (a tiny
# make_dataset call), so the times cover the conversion and the pipeline, not the imports.
# Figure (the shape of bench/_common.py's, written here by hand): R seconds / Python seconds of
# the same round, median and spread over the rounds. Writes bench/results/data_r.json.
#
#   Rscript bench/bench_data.R [n] [p] [reps]      (run from the repository root)

args <- commandArgs(trailingOnly = TRUE)
n <- if (length(args) >= 1) as.numeric(args[[1]]) else 1e6
p <- if (length(args) >= 2) as.integer(args[[2]]) else 100L
reps <- if (length(args) >= 3) as.integer(args[[3]]) else 3L
python <- Sys.getenv("KERASDIST_PYTHON", file.path(getwd(), ".venv", "bin", "python"))
options(kerasdist.python = python)
suppressMessages(library(kerasdist))

mem_mb <- function(field) {
  line <- grep(paste0("^", field, ":"), readLines("/proc/self/status"), value = TRUE)
  as.numeric(gsub("[^0-9]", "", line)) / 1024
}

invisible(make_dataset(matrix(0, 4, 2), batch_size = 2))  # load TensorFlow and kerasdist
x <- matrix(stats::runif(n * p), n, p)
r_times <- numeric(reps)
invisible(gc())
rss_before <- mem_mb("VmRSS")
for (i in seq_len(reps)) {
  invisible(gc())
  r_times[[i]] <- system.time({
    ds <- make_dataset(x, batch_size = 1024L, seed = 0L)
    first <- reticulate::iter_next(reticulate::as_iterator(ds))
  })[["elapsed"]]
  rm(ds, first)
}
r_peak <- mem_mb("VmHWM")

py_code <- sprintf('
import json, sys, time, numpy as np, kerasdist
def mem(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
kerasdist.make_dataset(np.zeros((4, 2)), batch_size=2)
x = np.random.default_rng(0).random((%d, %d))
before = mem("VmRSS")
times = []
for _ in range(%d):
    t0 = time.perf_counter()
    ds = kerasdist.make_dataset(x, batch_size=1024, seed=0)
    next(iter(ds))
    times.append(time.perf_counter() - t0)
    del ds
print(json.dumps({"times": times, "rss_before": before, "peak": mem("VmHWM")}))
', as.integer(n), p, reps)
out <- system2(python, c("-c", shQuote(py_code)), stdout = TRUE, env = "TF_CPP_MIN_LOG_LEVEL=2")
py <- jsonlite::fromJSON(out[[length(out)]])

ratios <- r_times / py$times
r_figure <- list(
  name = "r_matrix_vs_numpy_ingest_seconds",
  median = round(stats::median(ratios), 4), min = round(min(ratios), 4), max = round(max(ratios), 4),
  runs = I(round(ratios, 4)), target = NA, met = NA,
  what = paste0(
    "seconds from an R double matrix to make_dataset()'s first batch (through reticulate) / the same ",
    "from a NumPy float64 array in Python, round by round: informational, no target was set; ",
    "above 1 is what the R front end adds")
)
common <- reticulate::import_from_path("_common", file.path("bench"))
result <- list(
  benchmark = "data_r", device = common$device_name(), figures = list(r_figure),
  n = n, p = p, matrix_mb = n * p * 8 / 2^20, reps = reps,
  r_seconds = I(round(r_times, 2)), r_median_s = round(stats::median(r_times), 2),
  r_rss_before_mb = round(rss_before), r_peak_mb = round(r_peak),
  python_seconds = I(round(py$times, 2)), python_median_s = round(stats::median(py$times), 2),
  python_rss_before_mb = round(py$rss_before), python_peak_mb = round(py$peak)
)
line <- jsonlite::toJSON(result, auto_unbox = TRUE, na = "null", digits = NA)
cat(line, "\n")
dir.create(file.path("bench", "results"), showWarnings = FALSE)
writeLines(jsonlite::prettify(line, indent = 1), file.path("bench", "results", "data_r.json"))
