#!/usr/bin/env bash
# Make PostgreSQL server binaries available for the PostgreSQL store tests and benchmarks.
#
# Nothing to do when initdb is already there (PG_BINDIR, /usr/lib/postgresql/*/bin or PATH). Otherwise, as root on
# Debian/Ubuntu, install the distribution's `postgresql` package (which also creates the unprivileged `postgres`
# user the tests run the server as, since PostgreSQL refuses to run as root). Elsewhere print how to get it and exit
# 0: the PostgreSQL tests then skip with that reason.
set -euo pipefail

have_initdb() {
    [ -n "${PG_BINDIR:-}" ] && [ -x "${PG_BINDIR}/initdb" ] && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null && return 0
    command -v initdb > /dev/null 2>&1
}

if have_initdb; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get > /dev/null 2>&1; then
    echo "install-postgres: installing Debian's postgresql package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql postgresql-contrib > /dev/null
    have_initdb && exit 0
fi
echo "install-postgres: no PostgreSQL server binaries; install PostgreSQL (e.g. apt-get install postgresql)" \
     "or set PG_BINDIR. The PostgreSQL store tests will be skipped." >&2
exit 0
