#!/usr/bin/env bash
# `make dist`: the artifacts people install, in dist/ (or $1): the Python wheel and sdist, and the R
# source tarball (which carries the Python sources and pinned versions for install_kerasdist()).
# KERASDIST_DIST_VIGNETTES=0 builds the R tarball without running the vignettes (the tests do).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
mkdir -p "$out"
rm -f "$out"/kerasdist-*.whl "$out"/kerasdist-*.tar.gz "$out"/kerasdist_*.tar.gz

.venv/bin/python - "$out" <<'PY'
import sys

from hatchling.build import build_sdist, build_wheel

print(f"dist: {build_wheel(sys.argv[1])}")
print(f"dist: {build_sdist(sys.argv[1])}")
PY

vignettes=()
[ "${KERASDIST_DIST_VIGNETTES:-1}" = 0 ] && vignettes=(--no-build-vignettes)
tools/r_build.sh "$out" "${vignettes[@]}"
echo "dist: $(basename "$out"/kerasdist_*.tar.gz)"
