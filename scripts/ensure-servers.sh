#!/usr/bin/env bash
# Installs the server binaries the integration tests start themselves.
# A fresh machine may have only the PostgreSQL client; the tests need initdb
# and pg_ctl. Nothing is started here: the test session starts throw-away
# servers on loopback ports and stops them afterwards.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-servers: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "ensure-servers: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
