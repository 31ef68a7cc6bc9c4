#!/usr/bin/env bash
# routes.sh - the route table (server/routes.c) and openapi.yaml list the
# same routes, methods and query parameters; a route the spec lacks is named.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 tests/api/routes_vs_spec.py server/routes.c openapi.yaml
