#!/usr/bin/env bash
# Render an `npuforge analyze --report` HTML file in headless Chromium and save a PNG screenshot.
#
#   scripts/report_screenshot.sh report.html [out.png] [WIDTHxHEIGHT]
#
# Needs Debian's chromium (apt-get install -y chromium). Chromium runs without network
# services (no QUIC, background networking, component updates or sync) and with a
# throw-away profile; the report itself references nothing outside the file.
set -euo pipefail
html=${1:?usage: $0 report.html [out.png] [WIDTHxHEIGHT]}
png=${2:-${html%.html}.png}
size=${3:-1280x2000}
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "$0: $chromium not found; apt-get install -y chromium (or set CHROMIUM)" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
url="file://$(realpath "$html")"
out=$(realpath -m "$png")
"$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
    --screenshot="$out" --window-size="${size/x/,}" "$url" >/dev/null 2>&1
[ -s "$out" ] || { echo "$0: chromium wrote no screenshot" >&2; exit 1; }
echo "$out"
