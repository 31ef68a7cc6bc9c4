#!/usr/bin/env bash
# openapi.sh - the API description against the daemon: openapi.yaml is valid
# OpenAPI 3.1 (openapi-spec-validator), the binary serves it byte for byte,
# the route table and the spec agree (routes.sh), and a bounded schemathesis
# run against a live tstaged finds nothing.
#
# schemathesis runs every check but positive_data_acceptance: a schema cannot
# say that a body's length must be the dtype's size times the shape's
# product, that a device must exist on this node, or that a page token must
# be one the server gave, so schema-valid requests that break those rules
# are rightly 400. Everything else (no 5xx, documented codes and content
# types, responses matching their schemas, invalid requests refused, 405s
# with Allow) must hold. Path parameters are drawn mostly from objects the
# script creates first, so that the calls reach past 404.
#
# Knobs: TSTAGED (build/tstaged), ST_MAX_EXAMPLES (10), ST_SEED (1),
# ST_MAX_TIME (seconds, 180).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/api/lib.sh

venv openapi-spec-validator schemathesis pyyaml
"$API_VENV/bin/openapi-spec-validator" openapi.yaml
"$API_VENV/bin/python" tests/api/routes_vs_spec.py server/routes.c openapi.yaml

mkdir -p "$API_TMP/data"
start_daemon st --data-dir "$API_TMP/data"
base=http://127.0.0.1:$PORT
curl -sf "$base/openapi.yaml" | cmp - openapi.yaml ||
	{ echo "GET /openapi.yaml differs from openapi.yaml (rebuild tstaged)" >&2; exit 1; }

# what the generated calls may name
put() { curl -sf -o /dev/null -X PUT --data-binary "@$1" "$base/v1/arrays/$2"; }
head -c 64 /dev/zero >"$API_TMP/z64"
put "$API_TMP/z64" 'a?dtype=float32&shape=4,4'
put "$API_TMP/z64" 'b?dtype=uint8&shape=64&memory_kind=pinned_host'
curl -sf -o /dev/null -X POST "$base/v1/shardings" \
	-d '{"name": "s", "sharding": {"device": "sim:0", "memory_kind": "pinned_host"}}'
curl -sf -o /dev/null -X POST "$base/v1/models?wait=true" \
	-d '{"name": "m", "mlp": {"layers": 1, "d_model": 4}}'
op=$(curl -sf -X POST "$base/v1/arrays/a:copy?wait=false" -d '{"out": "c", "memory_kind": "pinned_host"}' |
	python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["id"])')

cat >"$API_TMP/schemathesis.toml" <<TOML
[dictionaries.arrays]
values = ["a", "b", "c"]
[dictionaries.shardings]
values = ["s"]
[dictionaries.models]
values = ["m"]
[dictionaries.operations]
values = ["$op"]
[dictionaries.devices]
values = ["sim:0", "sim:1", "cpu:0"]

[parameters]
"path.array" = { dictionary = "arrays", probability = 0.8 }
"path.sharding" = { dictionary = "shardings", probability = 0.8 }
"path.model" = { dictionary = "models", probability = 0.8 }
"path.operation" = { dictionary = "operations", probability = 0.8 }
"path.device" = { dictionary = "devices", probability = 0.8 }

# a trace answers after the seconds it records (up to 60, past the 30 s
# request timeout): generated calls record one second; the values refused
# are it_trace's
[[operations]]
include-path = "/v1/trace"
parameters = { "query.seconds" = 1 }
TOML

# from a scratch folder: schemathesis keeps its cache (.schemathesis/) in the
# current one
root=$PWD
mkdir -p build
(cd "$API_TMP" && "$root/$API_VENV/bin/st" --config-file schemathesis.toml run \
	"$root/openapi.yaml" --url "$base" \
	--max-examples "${ST_MAX_EXAMPLES:-10}" --seed "${ST_SEED:-1}" --workers 1 \
	--max-time "${ST_MAX_TIME:-180}" --request-timeout 30 --continue-on-failure \
	--exclude-checks positive_data_acceptance \
	--report junit --report-dir "$root/build/schemathesis")
echo "openapi: spec valid, served as built, routes agree, schemathesis clean"
