#!/usr/bin/env bash
# Logic mutants: switches on, one at a time, each rule-breaking mutant of
# core's protocol logic (`mutant!("name")` in core/src: a skipped
# re-validation, a grant to a held lock, a forgotten repair, ...) and runs
# the simulator until a run finds a violation (killed) or the seeds run out
# (survived). Exits 0 only when every mutant is killed.
#
#   tests/logic-mutants.sh [SHORT [DEEP]]    (default 16 short seeds, 24 deep)
#   MUTANTS="a b" tests/logic-mutants.sh     (only these)
#
# Each mutant first meets the short configuration (3-4 hosts, 80 operations,
# crashes, lazy caches and mixed sizes by seed); one that survives it meets
# the deep one (4-5 hosts, 300 operations, the same scenarios).
#
# The mutants exist only in a simulator built with
# RUSTFLAGS="--cfg cxlkv_mutants" (in its own target directory, found through
# cargo); the library never contains them. A mutant counts as killed only
# when the simulator exits with its violation status (1); any other outcome
# stops the check with status 2.
set -uo pipefail
cd "$(dirname "$0")/.."
short=${1:-16}
deep=${2:-24}
target=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') || exit 2
exe=$(RUSTFLAGS="--cfg cxlkv_mutants" cargo build --release --locked -q -p cxlkv-tests --bin cxlkv-sim \
  --target-dir "$target/mutants" --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cxlkv-sim":
        print(m["executable"])') || {
  echo "logic mutants: could not build the simulator" >&2
  exit 2
}
if [ -z "$exe" ] || [ ! -x "$exe" ]; then
  echo "logic mutants: cargo named no simulator binary" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sim=$tmp/cxlkv-sim
cp "$exe" "$sim"
# The build must carry the mutants, and without one switched on it must pass.
if ! "$sim" run --seed 1 --ops 20 --mutant none.such --quiet >/dev/null 2>&1; then
  echo "logic mutants: the simulator refuses --mutant or fails unmutated" >&2
  exit 2
fi

all=$(grep -rhoE 'mutant!\("[a-z_]+\.[a-z_.]+"\)' core/src --include='*.rs' | sed -E 's/mutant!\("(.*)"\)/\1/')
dups=$(printf '%s\n' "$all" | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "logic mutants: names used at more than one place:" >&2
  printf '  %s\n' $dups >&2
  exit 2
fi
mutants=$(printf '%s\n' "$all" | sort)
if [ -n "${MUTANTS:-}" ]; then mutants=$MUTANTS; fi

# Runs seed $2 of configuration $3 (short or deep) with mutant $1; prints
# the verdict's exit status.
run_one() {
  local m=$1 s=$2 cfg=$3 crash= lazy= mixed= hosts ops
  if [ $((s % 2)) -eq 1 ]; then crash=--crash; fi
  if [ $((s % 4)) -ge 2 ]; then lazy=--lazy; fi
  if [ $((s % 6)) -eq 3 ]; then mixed=--mixed; fi
  if [ "$cfg" = short ]; then
    hosts=$((s % 8 >= 4 ? 4 : 3))
    ops=80
  else
    hosts=$((s % 8 >= 4 ? 5 : 4))
    ops=300
  fi
  "$4" run --seed "$s" --hosts "$hosts" --ops "$ops" $crash $lazy $mixed --mutant "$m" --quiet >/dev/null 2>&1
  echo $?
}
export -f run_one

one() {
  local m=$1 s rc cfg n
  for cfg in short deep; do
    if [ "$cfg" = short ]; then n=$2; else n=$3; fi
    for s in $(seq 1 "$n"); do
      rc=$(run_one "$m" "$s" "$cfg" "$4")
      case $rc in
        0) ;;
        1)
          echo "killed   $m ($cfg seed $s)"
          return 0
          ;;
        *)
          echo "ABORT    $m ($cfg seed $s): the simulator exited $rc, not with a verdict" >&2
          return 255
          ;;
      esac
    done
  done
  echo "SURVIVED $m"
}
export -f one

out=$(printf '%s\n' $mutants | xargs -P 2 -I{} bash -c 'one "$@"' _ {} "$short" "$deep" "$sim")
xrc=$?
if [ "$xrc" -ne 0 ]; then
  echo "logic mutants: stopped: a run ended without a verdict" >&2
  exit 2
fi
out=$(printf '%s\n' "$out" | sort -k2)
echo "$out"
n=$(printf '%s\n' "$out" | grep -c .)
k=$(printf '%s\n' "$out" | grep -c '^killed')
want=$(printf '%s\n' $mutants | grep -c .)
if [ "$n" -ne "$want" ]; then
  echo "logic mutants: $n verdicts for $want mutants" >&2
  exit 2
fi
echo "logic mutants: $k killed of $n"
[ "$k" -eq "$n" ]
