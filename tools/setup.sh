#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: R from Debian, a pinned .venv, kerasdist in both
# languages. Each step is skipped when its stamp is newer than what it depends on.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES="python3 python3-venv r-base-core r-cran-reticulate r-cran-testthat r-cran-knitr r-cran-rmarkdown r-cran-roxygen2 pandoc"
STAMPS=.venv/.stamps

need_debian_packages() {
  local pkg
  for pkg in $DEBIAN_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || return 0
  done
  return 1
}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_debian_packages() {
  if need_debian_packages; then
    echo "setup: installing Debian packages: $DEBIAN_PACKAGES"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $DEBIAN_PACKAGES >/dev/null
  fi
}

install_python_env() {
  if [ ! -x .venv/bin/pip ]; then  # a venv whose ensurepip failed has python but no pip
    echo "setup: creating .venv"
    python3 -m venv .venv
  fi
  mkdir -p "$STAMPS"
  if [ ! -f "$STAMPS/pip" ] || [ tools/constraints.txt -nt "$STAMPS/pip" ]; then
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

r_sources_changed() {
  [ ! -f "$STAMPS/r-package" ] && return 0
  [ -n "$(find DESCRIPTION NAMESPACE R man inst -newer "$STAMPS/r-package" 2>/dev/null | head -n 1)" ]
}

install_r_package() {
  if r_sources_changed; then
    echo "setup: installing the kerasdist R package"
    R CMD INSTALL --no-test-load . >/dev/null 2>.venv/r-install.log || { cat .venv/r-install.log; exit 1; }
    touch "$STAMPS/r-package"
  fi
}

install_debian_packages
install_python_env
install_r_package
