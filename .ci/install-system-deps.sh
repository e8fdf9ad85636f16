#!/usr/bin/env bash
# Debian packages the test suite uses as real tools: tmux (the TUI in a real terminal),
# systemd (systemd-analyze verify/security on the unit files), iproute2 (network namespaces and tbf
# for the partition and bandwidth tests), iptables (the NAT routers of the volunteers-at-home test),
# curl (reaches a node's API inside its namespace), and Prometheus' own binaries (unpacked, service
# not started).
# Needs root; without root it only says what is missing (those tests then skip outside CI).
set -euo pipefail

missing=()
command -v tmux >/dev/null || missing+=(tmux)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v ip >/dev/null && command -v tc >/dev/null || missing+=(iproute2)
command -v curl >/dev/null || missing+=(curl)
command -v iptables >/dev/null || missing+=(iptables)

if [[ $(id -u) -ne 0 ]]; then
    [[ ${#missing[@]} -eq 0 ]] || echo "not root: cannot install ${missing[*]} (the tests that need them will skip)"
    exit 0
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$(dirname "$0")/install-prometheus.sh" "${P2PTRAIN_PROMETHEUS_DIR:-/opt/prometheus-deb}"
