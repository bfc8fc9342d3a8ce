#!/usr/bin/env bash
# Install the Debian packages the integration tests use (promtool, prometheus, alertmanager, chromium for
# gpufeed report's rendering test, node and npm for the dashboards' Grafana schema check) when missing, then
# the pinned npm packages of that check (tests/rules/grafana-schema/package-lock.json).
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing Debian packages: ${need[*]} -- run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi
# Grafana's published schema (@grafana/schema) and tsc, exactly as locked; again whenever the lock changes.
schema=tests/rules/grafana-schema
if [[ ! -f $schema/node_modules/.package-lock.json || $schema/package-lock.json -nt $schema/node_modules/.package-lock.json ]]; then
  npm ci --prefix "$schema" --no-audit --no-fund --loglevel=error >/dev/null
fi
