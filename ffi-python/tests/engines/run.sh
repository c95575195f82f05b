#!/usr/bin/env bash
# The engine adapters' tests, against the real engine packages: a virtual
# environment with torch and the engines' interface code (cached between
# runs, keyed by requirements.txt and the engine versions: a few GB, made
# once), the cxlkv wheel built from this checkout, then pytest. Prints one
# "test result" line per passing part and `engines: N passed, M failed`
# last. Exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"
engines="vllm==0.33.0 sglang==0.5.23 lmcache==0.5.6"
stamp=$( (cat "$here/requirements.txt"; echo "$engines") | sha256sum | cut -c1-12)
venv=${CXLKV_ENGINES_VENV:-$HOME/.cache/cxlkv/engines-$stamp}
if [ ! -e "$venv/.complete" ]; then
  echo "engines venv: creating $venv (torch and the engines' interface code; cached for later runs)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
  # The engines without their serving stacks (their interfaces import only
  # what requirements.txt lists).
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q --no-deps $engines
  touch "$venv/.complete"
fi
# Dynamo's router index (dynamo._core), for the KV event tests: its runtime
# wheel alone (its Python dependencies are in the venv already), added to
# the cached venv once.
dynamo=ai-dynamo-runtime==1.6.1
if [ ! -e "$venv/.dynamo-1.6.1" ]; then
  "$venv/bin/python" -m pip install -q --no-deps "$dynamo"
  touch "$venv/.dynamo-1.6.1"
fi
# The command-line binary the KV event tests run, built and found through
# cargo (any CARGO_TARGET_DIR).
cargo build --release --locked -q -p cxlkv-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export CXLKV_CLI="$target_dir/release/cxlkv"
# cxlkv from this checkout: a wheel built by maturin (installed in the
# engines venv itself, so this script runs on its own), into the engines
# venv.
if [ ! -x "$venv/bin/maturin" ]; then
  "$venv/bin/python" -m pip install -q "maturin>=1.9,<2"
fi
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
maturin=$venv/bin/maturin
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} "$maturin" build --release -q -m ffi-python/Cargo.toml -o "$wheels"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/cxlkv-*.whl
echo "test result: ok. 1 passed; 0 failed (cxlkv wheel installed beside $engines, torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
rc_extra=0
if (cd /tmp && "$venv/bin/python" -m mypy --config-file "$here/mypy.ini" -m cxlkv.vllm -m cxlkv.sglang -m cxlkv.lmcache -m cxlkv.engines); then
  echo "test result: ok. 1 passed; 0 failed (mypy --strict on the adapters, against the engines' types)"
else
  echo "adapters' types (mypy --strict): 1 failed"
  rc_extra=1
fi
out=$(mktemp)
set +e
(cd "$here" && "$venv/bin/python" -m pytest -p no:cacheprovider .) 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
passed=$( (tail -n 1 "$out" | grep -Eo '[0-9]+ passed' || true) | awk '{s+=$1} END {print s+0}')
failed=$( (tail -n 1 "$out" | grep -Eo '[0-9]+ (failed|errors?)' || true) | awk '{s+=$1} END {print s+0}')
rm -f "$out"
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
if [ "$rc" -eq 0 ]; then
  echo "test result: ok. ${passed} passed; 0 failed (engine adapters, ffi-python/tests/engines)"
fi
# The adapters' overhead against raw cxlkv batch calls, small (smoke runs:
# they print numbers; they pass when every call succeeded).
for bench in bench_vllm.py bench_sglang.py bench_lmcache.py; do
  if (cd "$here" && "$venv/bin/python" -W ignore "$bench" --quick); then
    echo "test result: ok. 1 passed; 0 failed ($bench smoke run)"
  else
    echo "$bench: 1 failed"
    rc_extra=1
  fi
done
[ "$rc" -eq 0 ] && rc=$rc_extra
[ "$rc_extra" -eq 0 ] || failed=$((failed + 1))
echo "engines: ${passed} passed, ${failed} failed"
exit "$rc"
