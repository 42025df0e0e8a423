#!/bin/sh
# Installs the build into a scratch prefix and builds tests/install/consumer.c against it the
# way a user outside this tree would: the headers and flags from the installed fp4doctor.pc
# only. Arguments: BUILD_DIR SOURCE_DIR C_COMPILER VERSION.
set -eu
build=$1 src=$2 cc=$3 version=$4
scratch=$(mktemp -d "${TMPDIR:-/tmp}/fp4d_install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT INT TERM
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
# moved after the install: the .pc file finds its prefix from its own place
mv "$scratch/prefix" "$scratch/moved"
pc=$(dirname "$(find "$scratch/moved" -name fp4doctor.pc | head -n 1)")
[ -n "$pc" ] || { echo "fp4doctor.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH="$pc"
[ "$(pkg-config --modversion fp4doctor)" = "$version" ] || { echo "pkg-config --modversion: $(pkg-config --modversion fp4doctor), expected $version" >&2; exit 1; }
"$scratch/moved/bin/fp4doctor" --version | grep -q "$version" || { echo "the installed CLI does not run" >&2; exit 1; }
# shellcheck disable=SC2046 # the flags are meant to split
"$cc" -std=c11 -Wall -Wextra -Werror -o "$scratch/consumer" "$src/tests/install/consumer.c" \
    $(pkg-config --cflags --libs fp4doctor)
"$scratch/consumer" "$version"
