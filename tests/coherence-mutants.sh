#!/usr/bin/env bash
# Coherence mutants: disables each flush, invalidate and fence call site of
# core in turn and runs the simulator harness until a run finds a violation
# (the mutant is killed, with the seed that killed it) or the seeds run out
# (it survived). Exits 0 only when every mutant is killed.
#
#   tests/coherence-mutants.sh [SHORT [DEEP]]  (default 8 short seeds, 16 deep)
#   SITES="a b" tests/coherence-mutants.sh  (only these sites)
#
# A mutant counts as killed only when the simulator exits with its violation
# status (1). Any other outcome (it could not run, crashed, was killed) stops
# the check with status 2: it says nothing about the mutant. The simulator is
# found through cargo, so this works under any CARGO_TARGET_DIR.
#
# Sites named `*.hint` are left out: they only make a later locked re-read
# more likely to succeed (a stale hint costs a wasted or missed try, never a
# wrong result), so removing one cannot change any outcome; each says so in
# its SYNC comment.
set -uo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-8}
deep=${2:-16}
exe=$(cargo build --release --locked -q -p cxlkv-tests --bin cxlkv-sim --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cxlkv-sim":
        print(m["executable"])') || {
  echo "coherence mutants: could not build the simulator" >&2
  exit 2
}
if [ -z "$exe" ] || [ ! -x "$exe" ]; then
  echo "coherence mutants: cargo named no simulator binary" >&2
  exit 2
fi
# A private copy: rebuilding while this runs must not change the binary.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sim=$tmp/cxlkv-sim
cp "$exe" "$sim"

# Every site name in core's non-test code (names have a dot; test-only sites
# such as Site("t") do not). Core's build refuses duplicates; so does this.
all=$(grep -rhoE 'Site\("[a-z_]+\.[a-z_.]+"\)' core/src --include='*.rs' | sed -E 's/Site\("(.*)"\)/\1/')
dups=$(printf '%s\n' "$all" | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "coherence mutants: site names used at more than one call site:" >&2
  printf '  %s\n' $dups >&2
  exit 2
fi
sites=$(printf '%s\n' "$all" | grep -v '\.hint$' | sort)
if [ -n "${SITES:-}" ]; then sites=$SITES; fi

one() {
  local site=$1 s rc cfg n hosts ops
  for cfg in short deep; do
    if [ "$cfg" = short ]; then n=$2; else n=$3; fi
    for s in $(seq 1 "$n"); do
      # Odd seeds crash a host; seeds 2 and 3 (mod 4) run lazy caches, the
      # others busy ones; seeds 4 to 7 (mod 8) run one host more, so a
      # lock's waiter can be on neither the manager's nor the recovering
      # host; seeds 3 (mod 6) mix block sizes up to two chunks. The short
      # configuration is small and busy; a site that survives it meets the
      # deep one (more hosts, more operations: rarer interleavings).
      crash=; lazy=; mixed=
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
      "$4" run --seed "$s" --hosts "$hosts" --ops "$ops" $crash $lazy $mixed --disable "$site" --quiet >/dev/null 2>&1
      rc=$?
      case $rc in
        0) ;;
        1)
          echo "killed   $site ($cfg seed $s)"
          return 0
          ;;
        *)
          echo "ABORT    $site ($cfg seed $s): the simulator exited $rc, not with a verdict" >&2
          return 255
          ;;
      esac
    done
  done
  echo "SURVIVED $site"
}
export -f one

out=$(printf '%s\n' $sites | xargs -P 2 -I{} bash -c 'one "$@"' _ {} "$seeds" "$deep" "$sim")
xrc=$?
if [ "$xrc" -ne 0 ]; then
  echo "coherence mutants: stopped: a run ended without a verdict" >&2
  exit 2
fi
out=$(printf '%s\n' "$out" | sort -k2)
echo "$out"
n=$(printf '%s\n' "$out" | grep -c .)
k=$(printf '%s\n' "$out" | grep -c '^killed')
want=$(printf '%s\n' $sites | grep -c .)
if [ "$n" -ne "$want" ]; then
  echo "coherence mutants: $n verdicts for $want sites" >&2
  exit 2
fi
echo "coherence mutants: $k killed of $n"
[ "$k" -eq "$n" ]
