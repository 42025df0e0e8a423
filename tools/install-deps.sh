#!/bin/sh
# Installs the Debian packages fp4doctor builds against, when they are missing and we are
# root; otherwise says what is missing and carries on (cmake then names what it lacks).
set -u
pkgs="cmake make gcc g++ pkg-config libjansson-dev libcurl4-openssl-dev libssl-dev libmicrohttpd-dev libcmocka-dev libopenblas-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "fp4doctor: missing packages:$missing (no apt-get here; install them by hand)" >&2
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  echo "fp4doctor: installing$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $missing >/dev/null \
    || { echo "fp4doctor: apt-get install failed for:$missing" >&2; exit 1; }
else
  echo "fp4doctor: missing packages:$missing — run: sudo apt-get install$missing" >&2
fi
exit 0
