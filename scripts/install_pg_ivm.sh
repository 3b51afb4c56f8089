#!/usr/bin/env bash
# Build and install pg_ivm (https://github.com/sraoss/pg_ivm) from its source, for the pg_ivm
# column of `idivm bench pg` and `idivm bench tpch`. idivm does not need pg_ivm (CI runs
# without it); the benchmarks leave the column out when the server cannot `LOAD 'pg_ivm'`.
#
#   scripts/install_pg_ivm.sh SRC_DIR
#
# SRC_DIR: a pg_ivm source tree (with pg_ivm.control and its Makefile), or a git repository
# of it (its HEAD is exported). The build runs in a temporary copy, so SRC_DIR stays clean.
# When the PostgreSQL server headers are missing they are installed with apt-get
# (postgresql-server-dev-<major>; as root, or through sudo).
#
# Environment: PG_CONFIG (default: the server's pg_config, else the one on PATH), PG_MAJOR
# (default: from pg_config --version), DESTDIR (install under this root instead of the system,
# e.g. to try the build; the server will not see it there).
#
# Afterwards, in the database the benchmarks use: LOAD 'pg_ivm' (they create the extension
# themselves with CREATE EXTENSION IF NOT EXISTS pg_ivm).
set -euo pipefail

die() {
    echo "install_pg_ivm: $*" >&2
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "'$*' needs root: run this script as root or install sudo"
    fi
}

[ $# -eq 1 ] || die "usage: $0 SRC_DIR (a pg_ivm source tree or git repository)"
src=$1
[ -d "$src" ] || die "$src is not a directory"
command -v make >/dev/null 2>&1 || die "make is not installed (apt-get install -y make gcc)"
command -v "${CC:-cc}" >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 \
    || die "no C compiler (apt-get install -y gcc)"

work=$(mktemp -d "${TMPDIR:-/tmp}/pg_ivm_build.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -f "$src/pg_ivm.control" ] && [ -f "$src/Makefile" ]; then
    cp -R "$src/." "$work/"
elif git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$src" archive HEAD | tar -x -C "$work" \
        || die "could not export HEAD of the git repository $src"
    [ -f "$work/pg_ivm.control" ] || die "the git repository $src holds no pg_ivm.control"
else
    die "$src is neither a pg_ivm source tree (no pg_ivm.control and Makefile) nor a git repository"
fi
version=$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$work/pg_ivm.control")

# pg_config: the one given, else the server's (Debian keeps it under /usr/lib/postgresql), else
# the one on PATH
if [ -z "${PG_CONFIG:-}" ]; then
    if [ -n "${PG_MAJOR:-}" ] && [ -x "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ]; then
        PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    elif command -v pg_config >/dev/null 2>&1; then
        PG_CONFIG=$(command -v pg_config)
    fi
fi
if [ -z "${PG_MAJOR:-}" ]; then
    [ -n "${PG_CONFIG:-}" ] || die "pg_config not found and PG_MAJOR not set: install PostgreSQL \
(or set PG_CONFIG to its pg_config, or PG_MAJOR to its major version)"
    PG_MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
fi
case $PG_MAJOR in
    '' | *[!0-9]*) die "could not tell PostgreSQL's major version (got '$PG_MAJOR'): set PG_MAJOR" ;;
esac

# the server headers (postgres.h), from apt when missing
headers() {
    [ -n "${PG_CONFIG:-}" ] && [ -f "$("$PG_CONFIG" --includedir-server 2>/dev/null)/postgres.h" ]
}
if ! headers; then
    command -v apt-get >/dev/null 2>&1 || die "PostgreSQL $PG_MAJOR's server headers are \
missing and apt-get is not available: install them (the server development package) by hand"
    echo "install_pg_ivm: installing postgresql-server-dev-$PG_MAJOR" >&2
    as_root apt-get install -y "postgresql-server-dev-$PG_MAJOR" || {
        as_root apt-get update && as_root apt-get install -y "postgresql-server-dev-$PG_MAJOR"
    } || die "apt-get could not install postgresql-server-dev-$PG_MAJOR"
    if [ -x "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ]; then
        PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    elif [ -z "${PG_CONFIG:-}" ] && command -v pg_config >/dev/null 2>&1; then
        PG_CONFIG=$(command -v pg_config)
    fi
    headers || die "the server headers are still missing after installing \
postgresql-server-dev-$PG_MAJOR (PG_CONFIG=${PG_CONFIG:-unset})"
fi

echo "install_pg_ivm: building pg_ivm ${version:-?} for PostgreSQL $PG_MAJOR ($PG_CONFIG)" >&2
make -C "$work" USE_PGXS=1 PG_CONFIG="$PG_CONFIG" >"$work/build.log" 2>&1 || {
    tail -n 30 "$work/build.log" >&2
    die "the build failed (the end of its log is above)"
}
install_args=(-C "$work" USE_PGXS=1 PG_CONFIG="$PG_CONFIG" install)
if [ -n "${DESTDIR:-}" ]; then
    make "${install_args[@]}" DESTDIR="$DESTDIR" >"$work/install.log" 2>&1
else
    as_root make "${install_args[@]}" >"$work/install.log" 2>&1
fi || {
    tail -n 30 "$work/install.log" >&2
    die "make install failed (the end of its log is above)"
}
lib="${DESTDIR:-}$("$PG_CONFIG" --pkglibdir)/pg_ivm.so"
[ -f "$lib" ] || die "make install ran but $lib is not there"
echo "install_pg_ivm: installed $lib (pg_ivm ${version:-?})" >&2
if [ -z "${DESTDIR:-}" ]; then
    echo "install_pg_ivm: check it with: psql -c \"LOAD 'pg_ivm'\"" >&2
fi
