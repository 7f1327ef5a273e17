#!/usr/bin/env bash
# Tests for deploy/: render the kustomization, validate against Kubernetes
# schemas, check the sidecar contract and the Dockerfile.
#
# Install (once; `make setup` can run exactly this):
#   python3 -m venv .venv-deploy && .venv-deploy/bin/pip install --disable-pip-version-check -q \
#     kubernetes-validate==1.37.0 PyYAML==6.0.2 dockerfile==3.4.0
# Renderer: `kubectl kustomize` (kustomize built into kubectl). This machine
# kind ships kubectl; on plain Debian: apt-get install -y kubernetes-client.
# Without kubectl the checks run on the python renderer's output instead
# (scripts/test-deploy-manifests.py explains both).
#
# Usage: scripts/test-deploy.sh      (prints "N passed, M failed"; exit 1 on failure)
set -u
cd "$(dirname "$0")/.." || exit 2
PY=.venv-deploy/bin/python
if [ ! -x "$PY" ] || ! "$PY" -c 'import kubernetes_validate, yaml, dockerfile' 2>/dev/null; then
  echo "missing .venv-deploy; create it with:" >&2
  echo "  python3 -m venv .venv-deploy && .venv-deploy/bin/pip install --disable-pip-version-check -q kubernetes-validate==1.37.0 PyYAML==6.0.2 dockerfile==3.4.0" >&2
  exit 2
fi
exec "$PY" scripts/test-deploy-manifests.py "$@"
