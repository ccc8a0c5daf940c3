# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
PYTHON := .venv/bin/python
export KERASDIST_PYTHON := $(CURDIR)/.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL := 2
# R repositories for the packages Debian lacks (keras3, tensorflow, reticulate >= 1.42): CRAN, or
# a mirror, e.g. KERASDIST_R_REPOS=file:///path/to/cran-mirror make test (space-separated list).
export KERASDIST_R_REPOS ?= https://cloud.r-project.org

.PHONY: demo test setup setup-demo docs r-docs bench dist gpu-check upstream-check

# Everything: what the demo needs, then the test and docs tools, the object-store servers,
# Chromium and (as root) Slurm.
setup:
	@tools/setup.sh

# Only what the demo runs on (TensorFlow, Keras, matplotlib, R and keras3), so `make demo` from
# nothing is quick; `make test` installs the rest.
setup-demo:
	@tools/setup.sh demo

demo: setup-demo
	@echo "== Python: kerasdist info --devices 2"
	@$(PYTHON) -m kerasdist info --devices 2
	@echo
	@echo "== R: simulate_devices(2); kerasdist_info()"
	@Rscript -e 'kerasdist::simulate_devices(2); kerasdist::kerasdist_info()'
	@echo
	@echo "== Python: kerasdist demo (CNN on the bundled digits, 2 CPU replicas, killed and resumed)"
	@$(PYTHON) -m kerasdist demo --run-dir runs/demo
	@echo
	@echo "== R: kerasdist::kerasdist_demo() (the same run, from R)"
	@Rscript -e 'kerasdist::kerasdist_demo("runs/demo-r")'

test: setup
	@tools/test.sh

# Every benchmark under bench/ (14-18 minutes on 2 cores: 13 min 52 s and 17 min 51 s on 2026-11-28): bench/results/*.json,
# summary.md, summary.png. `make bench BENCH="data checkpoint"` runs only those.
bench: setup
	@bench/run.sh $(BENCH)

# The GPU check (bench/gpu_check.py): what TensorFlow sees; with GPUs, mirrored fit over all of
# them against one and prefetch to the device; then mixed precision / XLA, background saves and the
# advisor. Without a GPU it says so and runs the rest. bench/results/gpu_check.json.
gpu-check: setup
	@$(PYTHON) bench/gpu_check.py

# The artifacts people install, in dist/: the Python wheel and sdist, the R source tarball.
dist: setup
	@tools/dist.sh dist

# The R wrappers' roxygen written from the Python docstrings (tools/r_docs.py, with the R-specific
# words in tools/r_docs.json), then NAMESPACE and man/ from it. tests/python/test_r_docs.py fails
# when the committed R files differ from what the tool writes.
r-docs:
	@$(PYTHON) tools/r_docs.py
	@Rscript -e 'roxygen2::roxygenise()'

# Regenerate NAMESPACE and man/ from the roxygen comments in R/, then build the documentation site
# into site/ (guides, the vignettes run as articles, Python and R references, records;
# tools/docs_site.py): open site/index.html. Setup runs again after roxygen to install the R
# package the vignettes run on as it now is.
docs: setup
	@Rscript -e 'roxygen2::roxygenise()'
	@tools/setup.sh
	@$(PYTHON) tools/docs_site.py site --articles run

# Which of kerasdist's Keras workarounds the next Keras still needs: keras-nightly (and
# tf-nightly-cpu where PyPI has one newer than the installed TensorFlow) in a scratch virtualenv
# (build/upstream-check), the museum of upstream reports run there with every patch forced on, a
# table: still needed / no longer needed / broken (tools/upstream_check.py). Not part of `make test`.
upstream-check: setup
	@$(PYTHON) tools/upstream_check.py
