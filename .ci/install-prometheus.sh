#!/usr/bin/env bash
# Unpack Debian's prometheus package (prometheus + promtool binaries) into a directory,
# without installing it as a package and without starting its service.
# Usage: .ci/install-prometheus.sh [DEST]   (default /opt/prometheus-deb)
# Afterwards the binaries are DEST/usr/bin/{prometheus,promtool}; point the tests at them with
# P2PTRAIN_PROMETHEUS_BIN_DIR=DEST/usr/bin (the default matches the default DEST).
set -euo pipefail

dest="${1:-/opt/prometheus-deb}"
if [[ -x "$dest/usr/bin/promtool" && -x "$dest/usr/bin/prometheus" ]]; then
    echo "prometheus already unpacked in $dest"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"  # apt downloads as the unprivileged _apt user when it can

if [[ -z "$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v none || true)" ]]; then
    apt-get update -qq
fi
(cd "$work" && apt-get download -qq prometheus)
mkdir -p "$dest"
dpkg -x "$work"/prometheus_*.deb "$dest"
"$dest/usr/bin/promtool" --version | head -n 1
