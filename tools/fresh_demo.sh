#!/usr/bin/env bash
# `make demo` from nothing, timed: a fresh Debian 12 (debootstrap, kept as a pristine copy in DIR
# and copied for each run), a fresh clone of this checkout, in a mount namespace of its own. Each
# output line is prefixed with the seconds since the start. Root only.
#   tools/fresh_demo.sh [DIR]     (default /var/tmp/kerasdist-fresh; KERASDIST_R_REPOS as for make)
# The machine's own pip configuration, CA certificates and local wheel folders (a proxy's, a
# mirror's) go into the copy, as they would be on a new machine of the same kind.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/tmp/kerasdist-fresh}
PRISTINE=$DIR/pristine RUN=$DIR/run
[ "$(id -u)" -eq 0 ] || { echo "fresh_demo: needs root (debootstrap, chroot)" >&2; exit 2; }
REPOS=${KERASDIST_R_REPOS:-https://cloud.r-project.org}
if [ ! -x "$PRISTINE/bin/bash" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  debootstrap --variant=minbase --include=make,git,ca-certificates,python3,procps bookworm "$PRISTINE" \
    http://deb.debian.org/debian >"$DIR/debootstrap.log"
  cp /usr/local/share/ca-certificates/*.crt "$PRISTINE/usr/local/share/ca-certificates/" 2>/dev/null &&
    chroot "$PRISTINE" update-ca-certificates >/dev/null || true
  [ -f /etc/pip.conf ] && cp /etc/pip.conf "$PRISTINE/etc/"
  [ -d /etc/xdg/pip ] && mkdir -p "$PRISTINE/etc/xdg" && cp -a /etc/xdg/pip "$PRISTINE/etc/xdg/"
fi
rm -rf "$RUN" && cp -a "$PRISTINE" "$RUN" && cp /etc/resolv.conf "$RUN/etc/"
git clone -q . "$RUN/src/kerasdist"
BINDS=""
case "$REPOS" in file://*) BINDS="${REPOS#file://}:/cran"; REPOS=file:///cran ;; esac
for d in /opt/wheels /opt/pypi /opt/pypi-more; do [ -d "$d" ] && BINDS="$BINDS $d:$d"; done
unshare -m bash -c '
  set -e; R=$1 BINDS=$2 REPOS=$3
  stamp_lines() {  # each line prefixed with the seconds since the start, as it comes
    local t0=${EPOCHREALTIME/./} line
    while IFS= read -r line; do
      local us=$(( ${EPOCHREALTIME/./} - t0 ))
      printf "%4d.%d  %s\n" $((us / 1000000)) $((us % 1000000 / 100000)) "$line"
    done
  }
  mount -t proc proc "$R/proc"; mount --rbind /sys "$R/sys"; mount --rbind /dev "$R/dev"
  for b in $BINDS; do mkdir -p "$R${b#*:}"; mount --bind -o ro "${b%%:*}" "$R${b#*:}"; done
  echo "load average before: $(cut -d" " -f1-3 /proc/loadavg)"
  chroot "$R" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 KERASDIST_R_REPOS="$REPOS" PIP_FIND_LINKS=/opt/wheels \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    bash -c "cd /src/kerasdist && make demo" 2>&1 |
    stamp_lines
  status=${PIPESTATUS[0]}
  echo "load average after: $(cut -d" " -f1-3 /proc/loadavg)"
  exit "$status"
' fresh_demo "$RUN" "$BINDS" "$REPOS"
