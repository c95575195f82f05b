#!/usr/bin/env bash
# The Python package's checks: a virtual environment (.venv at the
# repository root) with maturin and the test tools, `pip install` of the
# package from source (what a user runs), the stub checked against the
# module (mypy.stubtest, mypy --strict), then pytest (strict: warnings are
# errors, per-test timeout).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${CXLKV_VENV:-$PWD/.venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q "maturin>=1.9,<2" "pytest>=8" "pytest-timeout>=2" "hypothesis>=6" "xxhash>=3" \
  "numpy>=1.24" "mypy>=1.10" typing_extensions "prometheus_client>=0.20"
# The command-line binary the metrics tests run, built and found through
# cargo (any CARGO_TARGET_DIR).
cargo build --release --locked -q -p cxlkv-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export CXLKV_CLI="$target_dir/release/cxlkv"
# Built as a user would install it: a wheel through the maturin backend,
# sharing this workspace's target directory.
CARGO_TARGET_DIR=$PWD/target "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall ./ffi-python
py_version=$("$venv/bin/python" -c 'import cxlkv; print(cxlkv.__version__)')
want=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
if [ "$py_version" != "$want" ]; then
  echo "cxlkv.__version__ is $py_version, Cargo.toml says $want: 1 failed"
  exit 1
fi
echo "test result: ok. 1 passed; 0 failed (pip install ./ffi-python; cxlkv.__version__ $py_version)"
stub_rc=0
mypy_config=$PWD/ffi-python/pyproject.toml
allowlist=$PWD/ffi-python/tests/stubtest-allowlist.txt
if (cd /tmp && "$venv/bin/python" -m mypy.stubtest --mypy-config-file "$mypy_config" --allowlist "$allowlist" cxlkv) &&
  "$venv/bin/python" -m mypy --strict --config-file "$mypy_config" ffi-python/python/cxlkv; then
  echo "test result: ok. 1 passed; 0 failed (stub matches the module: mypy.stubtest, mypy --strict)"
else
  echo "stub check (mypy.stubtest, mypy --strict): 1 failed"
  stub_rc=1
fi
# The README's quick start, as written (tests/readme-files.py checks that
# the README's block is this file).
if "$venv/bin/python" ffi-python/examples/quickstart.py >/dev/null; then
  echo "test result: ok. 1 passed; 0 failed (ffi-python/examples/quickstart.py: the README's quick start)"
else
  echo "ffi-python/examples/quickstart.py: 1 failed"
  stub_rc=1
fi
cd ffi-python
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
"$venv/bin/python" -m pytest -p no:cacheprovider 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
passed=$( (tail -n 1 "$out" | grep -Eo '[0-9]+ passed' || true) | awk '{s+=$1} END {print s+0}')
failed=$( (tail -n 1 "$out" | grep -Eo '[0-9]+ (failed|errors?)' || true) | awk '{s+=$1} END {print s+0}')
if [ "$rc" -eq 0 ]; then
  echo "test result: ok. ${passed} passed; 0 failed (pytest, ffi-python/tests)"
else
  echo "pytest: $((failed > 0 ? failed : 1)) failed (exit $rc)"
fi
[ "$stub_rc" -eq 0 ] || rc=1
# The Python bench, small (a smoke run: it prints numbers, it passes when it
# runs and every read returned the right bytes).
cd ..
if "$venv/bin/python" ffi-python/bench.py --mode clflush --sizes 16K,2M --ws-mib 32; then
  echo "test result: ok. 1 passed; 0 failed (ffi-python/bench.py smoke run)"
else
  echo "ffi-python/bench.py: 1 failed"
  rc=1
fi
exit "$rc"
