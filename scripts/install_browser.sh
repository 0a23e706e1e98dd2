#!/usr/bin/env bash
# Install the browser the dashboard test drives: Debian's Chromium (Playwright's own browser
# download does not work offline). It changes the system (apt-get, about 120 packages), so only
# the test setup (scripts/test.sh) runs it, or you do. Without it the browser test skips with
# the reason. Nothing else needs it: the quick start and the dashboard itself do not.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "install_browser: needs root and apt-get; install chromium yourself to run the" \
         "dashboard browser test (it skips otherwise)"
    exit 0
fi
echo "install_browser: installing Debian's chromium for the dashboard browser test"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1) \
    || echo "install_browser: could not install chromium; the dashboard browser test will skip"
