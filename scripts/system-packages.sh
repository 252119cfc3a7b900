#!/usr/bin/env bash
# Debian packages the test suite runs for real, installed where missing (none needs its service running):
#   systemd             the deploy tests' systemd-analyze and systemd-sysusers
#   postgresql          the server's PostgreSQL tests start their own cluster with its initdb and pg_ctl
#   chromium, -driver   the dashboard's browser test (Selenium)
# Without root or sudo (or off Debian) it says what is missing and carries on: those tests skip, saying why.
set -euo pipefail

missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
(( ${#missing[@]} )) || exit 0

sudo=()
if [[ $EUID -ne 0 ]]; then
    if sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        echo "system-packages: missing ${missing[*]} (apt-get install them as root); their tests will skip" >&2
        exit 0
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-packages: missing ${missing[*]} and no apt-get here; their tests will skip" >&2
    exit 0
fi

# Output only when it fails.
quiet() {
    local out
    out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}
quiet "${sudo[@]}" apt-get update
quiet "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
