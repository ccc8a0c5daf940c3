#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: R from Debian, a pinned .venv, kerasdist in both
# languages. Each step is skipped when its stamp is newer than what it depends on.
#   tools/setup.sh demo   what `make demo` runs on: TensorFlow, Keras, matplotlib, R, keras3
#   tools/setup.sh        everything (`make test`, docs, bench, dist): the demo's set, then the test
#                         and docs tools, the object-store servers, Chromium and (as root) Slurm
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
case "$MODE" in demo|full) ;; *) echo "usage: tools/setup.sh [demo]" >&2; exit 2 ;; esac

# R and what keras3's stack needs from Debian; keras3, tensorflow and a current reticulate (Debian has
# 1.28, keras3 needs >= 1.42) come from the R repositories in KERASDIST_R_REPOS (CRAN by default).
# libpython3-dev: Debian's python3 is linked statically and reticulate needs the shared libpython
# ("was not built with a shared library" from R otherwise; seen in a debootstrapped Debian 12).
DEMO_DEBIAN_PACKAGES="python3 python3-venv libpython3-dev r-base-core r-base-dev
  r-cran-callr r-cran-withr r-cran-jsonlite r-cran-rcpp r-cran-rcpptoml r-cran-here
  r-cran-png r-cran-rappdirs r-cran-generics r-cran-zeallot r-cran-fastmap r-cran-glue r-cran-cli
  r-cran-rlang r-cran-magrittr r-cran-processx r-cran-yaml r-cran-whisker r-cran-tidyselect
  r-cran-rstudioapi r-cran-lifecycle r-cran-base64enc r-cran-matrix r-cran-backports"
# Only the tests and the documentation use these: testthat, the vignettes' knitr and rmarkdown
# (pandoc), roxygen2 (make docs), chromium (the site is checked in a real browser,
# tests/python/test_docs_site.py).
TEST_DEBIAN_PACKAGES="r-cran-testthat r-cran-knitr r-cran-rmarkdown r-cran-roxygen2 pandoc chromium procps"
# The Slurm cluster tests (tests/python/test_slurm.py, tools/slurm_cluster.py) need root, so these
# are installed only when the set-up runs as root (as CI does); elsewhere those tests skip.
SLURM_PACKAGES="slurm-wlm munge iproute2 util-linux"
# The demo's Python packages, at the versions tools/constraints.txt pins (it pins the rest too).
DEMO_PYTHON_PACKAGES="tensorflow-cpu keras tensorboard numpy matplotlib hatchling"
STAMPS=.venv/.stamps

debian_packages() {
  echo "$DEMO_DEBIAN_PACKAGES"
  if [ "$MODE" = full ]; then
    echo "$TEST_DEBIAN_PACKAGES"
    [ "$(id -u)" -eq 0 ] && echo "$SLURM_PACKAGES"
  fi
  return 0
}

need_debian_packages() {
  local pkg
  for pkg in $(debian_packages); do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || return 0
  done
  return 1
}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_debian_packages() {
  if need_debian_packages; then
    local packages
    packages=$(debian_packages | tr '\n' ' ')
    echo "setup: installing Debian packages: $packages"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $packages >/dev/null
  fi
}

install_python_env() {
  if [ ! -x .venv/bin/pip ]; then  # a venv whose ensurepip failed has python but no pip
    echo "setup: creating .venv"
    python3 -m venv .venv
  fi
  mkdir -p "$STAMPS"
  if [ "$MODE" = demo ] && [ -f "$STAMPS/pip" ] && [ "$STAMPS/pip" -nt tools/constraints.txt ]; then
    :  # the full set is in place, the demo's included
  elif [ "$MODE" = demo ]; then
    if [ ! -f "$STAMPS/pip-demo" ] || [ tools/constraints.txt -nt "$STAMPS/pip-demo" ]; then
      echo "setup: installing the demo's pinned Python packages into .venv"
      # shellcheck disable=SC2086
      .venv/bin/pip install -q --disable-pip-version-check -c tools/constraints.txt $DEMO_PYTHON_PACKAGES
      touch "$STAMPS/pip-demo"
    fi
  elif [ ! -f "$STAMPS/pip" ] || [ tools/constraints.txt -nt "$STAMPS/pip" ]; then
    echo "setup: installing pinned Python packages into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -r tools/constraints.txt
    touch "$STAMPS/pip"
  fi
  if [ ! -f "$STAMPS/kerasdist" ] || [ pyproject.toml -nt "$STAMPS/kerasdist" ]; then
    echo "setup: installing kerasdist (editable) into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
    touch "$STAMPS/kerasdist"
  fi
}

install_r_dependencies() {
  Rscript tools/install_r_packages.R
}

r_sources_changed() {
  [ ! -f "$STAMPS/r-package" ] && return 0
  [ -n "$(find DESCRIPTION NAMESPACE R man inst configure python pyproject.toml tools/constraints.txt \
    -newer "$STAMPS/r-package" -not -path '*/__pycache__*' 2>/dev/null | head -n 1)" ]
}

# Its configure script bundles kerasdist's Python sources and pinned versions, for install_kerasdist().
install_r_package() {
  if r_sources_changed; then
    echo "setup: installing the kerasdist R package"
    R CMD INSTALL --no-test-load . >/dev/null 2>.venv/r-install.log || { cat .venv/r-install.log; exit 1; }
    touch "$STAMPS/r-package"
  fi
}

install_debian_packages
# The R packages (reticulate compiles) and the Python packages (downloads) install side by side.
r_log=$(mktemp)
install_r_dependencies >"$r_log" 2>&1 &
r_dependencies=$!
install_python_env
wait "$r_dependencies" || { cat "$r_log"; exit 1; }
cat "$r_log" && rm -f "$r_log"
install_r_package
