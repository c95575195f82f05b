#!/usr/bin/env bash
# Runs every check and test of cxlkv. Installs what it needs (Rust targets,
# a Python virtual environment in .venv with maturin and the test tools, the
# Node package's build tool from its lockfile).
# Usage: ./test.sh
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
cargo --version
if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
  rustup target add x86_64-unknown-none >/dev/null
  rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || echo "aarch64 target unavailable: skipping its check"
fi

step "format"
cargo fmt --all --check

step "bindings stand on platform alone (none names cxlkv-core)"
# The C, Python and Node doors and the CLI name the protocol's values through
# platform's re-exports (platform::kv), so platform is the one door to core.
if grep -n "cxlkv-core" ffi-c/Cargo.toml ffi-python/Cargo.toml ffi-node/Cargo.toml cli/Cargo.toml ||
  grep -rn "cxlkv_core" ffi-c/src ffi-c/tests ffi-python/src ffi-node/src cli/src cli/tests; then
  echo "a binding names cxlkv-core above: use cxlkv_platform::kv (or add the re-export there)" >&2
  exit 1
fi

step "clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "core builds without std (x86_64-unknown-none)"
cargo build -p cxlkv-core --target x86_64-unknown-none --locked

if rustup target list --installed 2>/dev/null | grep -q aarch64-unknown-linux-gnu; then
  step "platform compiles for aarch64 (dc civac / dsb sy path)"
  cargo check -p cxlkv-platform --target aarch64-unknown-linux-gnu --locked
fi

step "tests"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --locked 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

step "GPU path (libcuda loaded at run time: builds and answers without CUDA)"
# The workspace above builds platform with feature cuda (the C and Python
# bindings enable it); platform alone builds without it: check that build.
cargo clippy -p cxlkv-platform --all-targets --locked -- -D warnings 2>&1 | tail -n 3
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
cargo test -p cxlkv-platform --locked --lib gpu:: 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# On a machine with an NVIDIA GPU this checks and measures the path (exit 0);
# without one it must report CUDA unavailable (exit 2), never crash.
cargo run -p cxlkv-cli --locked -- gpu-check --quick
grc=$?
case "$grc" in
  0) echo "test result: ok. 1 passed; 0 failed (GPU checks on a GPU)" >> "$log" ;;
  2) echo "test result: ok. 1 passed; 0 failed (CUDA unavailable, reported as such)" >> "$log" ;;
  *) echo "cxlkv gpu-check: 1 failed (exit $grc)" >> "$log"; rc=1 ;;
esac

step "C API: generated files unchanged (cargo xtask gen), C/C++ tests against static and shared lib, valgrind"
# cxlkv.h and the Python stub's code list come from the code and platform's
# result-code table; the committed files must be what the step writes.
generated="ffi-c/include/cxlkv.h ffi-python/python/cxlkv/_cxlkv.pyi"
if cargo xtask gen && git diff --quiet -- $generated; then
  echo "test result: ok. 1 passed; 0 failed (cxlkv.h and _cxlkv.pyi match the generated files)" >> "$log"
else
  git diff --stat -- $generated
  echo "generated files drift: 1 failed (regenerate with cargo xtask gen and commit)" >> "$log"
  rc=1
fi
ffi-c/tests/run.sh 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

step "Python package: pip install ./ffi-python in .venv, stubtest, pytest (strict)"
ffi-python/tests/run.sh 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

step "Node package: npm ci, npm run build (napi), generated files, node --test (with a Python peer), bench smoke"
# After the Python step: the Node tests talk to a Python peer from .venv.
CXLKV_PYTHON="$PWD/.venv/bin/python" ffi-node/test/run.sh 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

step "engine adapters: the real engine packages in a cached venv (vLLM 0.33, SGLang 0.5.23, LMCache 0.5.6), mypy --strict, pytest, bench smoke"
ffi-python/tests/engines/run.sh 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

step "hostile peer under AddressSanitizer"
# The worker processes are rebuilt with ASan (nightly flag on the stable
# toolchain) and the hostile-peer test drives them.
asan_target=x86_64-unknown-linux-gnu
RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" \
  cargo build --locked --target "$asan_target" --target-dir target/asan -p cxlkv-tests --bin cxlkv-test-worker
CXLKV_TEST_WORKER="$PWD/target/asan/$asan_target/debug/cxlkv-test-worker" \
  cargo test --locked -p cxlkv-tests --test multiprocess hostile -- --nocapture 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
set -e

# Runs a command that counts as one test: passed when it exits 0.
counted() {
  local name=$1 crc
  shift
  set +e
  "$@"
  crc=$?
  set -e
  if [ "$crc" -eq 0 ]; then
    echo "test result: ok. 1 passed; 0 failed ($name)" >> "$log"
  else
    echo "$name: 1 failed (exit $crc)" >> "$log"
    rc=1
  fi
}

step "README quick starts are the example files the door tests run"
counted "README quick starts" python3 tests/readme-files.py

step "simulator sweep (fresh seeds of every configuration, step and time limits)"
counted "simulator sweep" cargo run --release --locked -q -p cxlkv-sim --bin cxlkv-sim -- sweep --from 9000 --seeds 3 --time-limit 240

step "coherence mutants (every flush, invalidate and fence site of core must matter)"
counted "coherence mutants" tests/coherence-mutants.sh 32 32

step "logic mutants (every rule of the protocol's logic must matter)"
counted "logic mutants" tests/logic-mutants.sh 16 96

step "smoke: cxlkv demo (3 seconds: prefill and decode processes, every byte verified)"
counted demo cargo run --release --locked -p cxlkv-cli -- demo --duration 3

step "smoke: cxlkv demo --ssd (3 seconds with an SSD tier on a disk directory)"
ssd_dir=$(mktemp -d /var/tmp/cxlkv-ssd.XXXXXX)
counted "demo --ssd" cargo run --release --locked -p cxlkv-cli -- demo --duration 3 --block-size 256K --region 512M --ssd "$ssd_dir"
rm -rf "$ssd_dir"

step "smoke: cxlkv bench (quick)"
cargo run --release --locked -p cxlkv-cli -- bench --quick --blocks 256 --modes coherent,clflush
ssd_dir=$(mktemp -d /var/tmp/cxlkv-ssd.XXXXXX)
cargo run --release --locked -p cxlkv-cli -- bench --tier "$ssd_dir" --tier-blocks 32
rm -rf "$ssd_dir"

step "the run left the tree as it found it (git status)"
if [ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1; then
  dirty=$(git status --porcelain --untracked-files=normal)
  if [ -z "$dirty" ]; then
    echo "test result: ok. 1 passed; 0 failed (git status clean after the run)" | tee -a "$log"
  else
    echo "$dirty"
    echo "tree changed by the run: 1 failed" | tee -a "$log"
    rc=1
  fi
fi

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
echo
echo "${passed} passed, ${failed} failed"
exit "$rc"
