#!/usr/bin/env bash
# Create the virtualenv and install qlayer with its test extras. Installs the Debian packages it
# needs (python3-venv, a JDK for Spark) when they are missing and we may use apt-get.
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}

need_apt=()
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "bootstrap: $PYTHON is missing or older than 3.11" >&2
  need_apt+=(python3 python3-venv python3-dev)
elif ! "$PYTHON" -m venv --help >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
if ! command -v make >/dev/null 2>&1; then need_apt+=(make); fi
if ! command -v java >/dev/null 2>&1; then need_apt+=(openjdk-17-jre-headless); fi
if ! command -v openssl >/dev/null 2>&1; then need_apt+=(openssl); fi  # TLS tests make certs
# the web console's browser test (tests/integration/test_console.py)
if ! command -v chromium >/dev/null 2>&1; then need_apt+=(chromium); fi
if ! command -v chromedriver >/dev/null 2>&1; then need_apt+=(chromium-driver); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need_apt[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  else
    echo "bootstrap: please install ${need_apt[*]} (needs root and apt-get)" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
echo "bootstrap: $VENV ready"
