#!/usr/bin/env bash
# The Node package's checks: installs the build tool from the lockfile
# (`npm ci`, falling back to `npm install`, which follows it), builds the
# addon as a user would (`npm run build`: napi build --platform --release),
# checks that the generated loader and typings are the committed ones and
# type-check a strict TypeScript client, runs `node --test`, and a small
# bench run. Prints one "test result" line per
# passing part; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
# From the committed lockfile exactly; a lockfile out of sync with
# package.json fails here (and npm install, run to go on, would rewrite it).
if npm ci --no-audit --no-fund >/dev/null 2>&1; then
  echo "test result: ok. 1 passed; 0 failed (npm ci: package-lock.json installs as committed)"
else
  echo "npm ci: 1 failed (package-lock.json is out of sync with package.json: npm install, then commit it)"
  rc=1
  npm install --no-audit --no-fund >/dev/null
fi
npm run build >/dev/null
echo "test result: ok. 1 passed; 0 failed (npm run build: the addon and its generated index.js, index.d.ts)"
if git ls-files --error-unmatch index.js index.d.ts >/dev/null 2>&1 && git diff --quiet -- index.js index.d.ts; then
  echo "test result: ok. 1 passed; 0 failed (index.js and index.d.ts match the generated files)"
else
  git diff --stat -- index.js index.d.ts
  echo "generated files drift: 1 failed (run npm run build in ffi-node and commit index.js, index.d.ts)"
  rc=1
fi
if npm run --silent typecheck; then
  echo "test result: ok. 1 passed; 0 failed (the typings type-check a strict TypeScript client: tsc, test/types.ts)"
else
  echo "typecheck: 1 failed"
  rc=1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
timeout 900 node --test --test-reporter=tap test/*.test.js 2>&1 | tee "$out"
trc=${PIPESTATUS[0]}
set -e
pass=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$out" | tail -n 1)
fail=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$out" | tail -n 1)
skip=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$out" | tail -n 1)
if [ "$trc" -eq 0 ] && [ "${fail:-1}" -eq 0 ] && [ "${skip:-0}" -eq 0 ]; then
  echo "test result: ok. ${pass} passed; 0 failed (node --test, ffi-node/test)"
else
  echo "node --test: $((${fail:-0} + ${skip:-0} > 0 ? ${fail:-0} + ${skip:-0} : 1)) failed (exit $trc, ${skip:-0} skipped)"
  rc=1
fi
# The README's quick start, as written, from an app directory that has
# the package installed (linked, as `npm install /path/to/ffi-node` does).
app=$(mktemp -d)
mkdir -p "$app/node_modules"
ln -s "$PWD" "$app/node_modules/cxlkv"
cp examples/quickstart.js "$app/"
if (cd "$app" && timeout 120 node quickstart.js >/dev/null); then
  echo "test result: ok. 1 passed; 0 failed (examples/quickstart.js: the README's quick start)"
else
  echo "examples/quickstart.js: 1 failed"
  rc=1
fi
rm -rf "$app"
# The bench, small (a smoke run: it prints numbers; it passes when it runs
# and every read returned the right bytes).
if timeout 600 node bench/bench.js --quick; then
  echo "test result: ok. 1 passed; 0 failed (ffi-node/bench/bench.js smoke run)"
else
  echo "ffi-node/bench/bench.js: 1 failed"
  rc=1
fi
exit "$rc"
