#!/usr/bin/env bash
# The README's picture of report.html: runs the demo (make demo's job) and photographs its page in
# headless Chromium (Debian: apt-get install chromium). Rerun it after changing the template.
#   bash docs/screenshot.sh [OUT_PNG]   (default docs/report.png)
set -euo pipefail
cd "$(dirname "$0")/.."
png="${1:-docs/report.png}"
out="$(mktemp -d)/demo"
.venv/bin/nccl-doctor demo --force --out "$out" >/dev/null 2>&1 || true  # it hangs on purpose: 124
test -s "$out/report.html" || { echo "no report.html in $out" >&2; exit 1; }
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome)"
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1240,1500 \
    --screenshot="$(realpath -m "$png")" "file://$out/report.html" 2>/dev/null
echo "Wrote $png (from $out/report.html)"
