# A cluster task (run with SLURM_JOB_ID and SLURM_PROCID set) that is sent SIGTERM after kerasdist
# has started Python but before any training, while R itself is busy: it must exit with 75 at once.
library(kerasdist)
invisible(run_context())
tools::pskill(Sys.getpid(), tools::SIGTERM)
for (i in 1:100) Sys.sleep(0.1)
writeLines("survived", "survived.txt")
