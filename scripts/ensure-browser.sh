#!/usr/bin/env bash
# Headless Chromium (Debian's package) and playwright-core (npm, tests/browser/) for the browser tests
# in tests/integration/test_report_browser.py. playwright-core downloads no browser: the tests point it
# at /usr/bin/chromium. Idempotent: installs only what is missing.
source "$(dirname "$0")/lib.sh"

command -v chromium >/dev/null 2>&1 || apt_install chromium
# Text in screenshots needs at least one font; chromium does not depend on one.
fc-list 2>/dev/null | grep -q . || apt_install fonts-dejavu-core
# Debian 12's nodejs is 18, which the pinned playwright-core (1.61) supports.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi

cd "$FB_ROOT/tests/browser"
if [ ! -f node_modules/playwright-core/package.json ] || \
   [ "$(node -p 'require("./node_modules/playwright-core/package.json").version' 2>/dev/null)" != \
     "$(node -p 'require("./package-lock.json").packages["node_modules/playwright-core"].version')" ]; then
  say "installing playwright-core into tests/browser/node_modules (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
