#!/usr/bin/env bash
# Installs the server binaries the integration tests start themselves.
# A fresh machine may have only the PostgreSQL client; the tests need initdb
# and pg_ctl, redis-server (with redis-cli), and chromium with chromium-driver. Nothing is started here: the
# test session starts throw-away servers on loopback ports and stops them
# afterwards.
#
# Debian's postgresql and redis-server packages may start a system service on
# install (a "main" cluster on 5432, Redis on 6379) unless policy-rc.d forbids
# it, as it does in most containers. The tests neither use nor disturb those:
# their servers run from their own directories and config files, on ports the
# kernel reports free, and connect only to those ports. This script leaves any
# system service as the package left it.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# redis-server pulls in redis-tools (redis-cli).
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# The usage page's browser test (tests/api/test_portal_browser.py) drives
# Debian's Chromium through its own chromedriver (Selenium never downloads one).
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)

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

# Fail here, not halfway through the test session, if a package did not
# bring what the tests run.
if [[ " ${missing[*]} " == *" redis-server "* ]]; then
    for tool in redis-server redis-cli; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "ensure-servers: $tool still not on PATH after installing redis-server" >&2
            exit 1
        fi
    done
fi
for tool in /usr/bin/chromium /usr/bin/chromedriver; do
    if [[ " ${missing[*]} " == *" chromium"* ]] && [ ! -x "$tool" ]; then
        echo "ensure-servers: $tool still missing after installing chromium and chromium-driver" >&2
        exit 1
    fi
done
