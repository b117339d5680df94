#!/usr/bin/env bash
# Chromium and its driver for the browser tests (the HTML report's viewer, the review app), run by
# scripts/test.sh: nothing to do when both are on PATH; installed with apt-get (Debian's chromium and
# chromium-driver) when this runs as root or with passwordless sudo; otherwise it says exactly what to
# run and fails.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
AS_ROOT=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then AS_ROOT="sudo"; else AS_ROOT="none"; fi
fi
if [ "$AS_ROOT" != "none" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup_browser.sh: installing chromium and chromium-driver (apt-get) for the browser tests" >&2
  $AS_ROOT apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $AS_ROOT apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
  exit 0
fi
cat >&2 <<'EOF'
The browser tests need Chromium and its driver (Debian: chromium, chromium-driver), which are not
installed, and this script cannot install them (it is not root). Install them and run it again:

    sudo apt-get install -y chromium chromium-driver

or leave the browser tests out (they are then reported as not run):

    CHEXPERCEPT_SKIP_BROWSER=1 bash scripts/test.sh
EOF
exit 1
