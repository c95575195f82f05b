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
# Each mutant first meets the short configuration (3-4 hosts, 80 operations),
# then, if it survives, the deep one (4-5 hosts, 300 operations); seeds
# choose crashes, lazy caches and mixed sizes (tests/lib/mutants.sh).
#
# The mutants exist only in a simulator built with
# RUSTFLAGS="--cfg cxlkv_mutants" (in its own target directory, found through
# cargo); the library never contains them. A mutant counts as killed only
# when the simulator exits with its violation status (1); any other outcome
# stops the check with status 2.
set -uo pipefail
cd "$(dirname "$0")/.."
. tests/lib/mutants.sh
short=${1:-16}
deep=${2:-24}
MUTANTS_TMP=$(mktemp -d)
trap 'rm -rf "$MUTANTS_TMP"' EXIT
target=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') || exit 2
sim=$(mutants_build_sim "--cfg cxlkv_mutants" "$target/mutants") || exit 2
# The build must carry the mutants, and with none switched on it must pass.
if ! "$sim" run --seed 1 --ops 20 --mutant none.such --quiet >/dev/null 2>&1; then
  echo "logic mutants: the simulator refuses --mutant or fails unmutated" >&2
  exit 2
fi
mutants=$(mutants_names 'mutant!\("([a-z_]+\.[a-z_.]+)"\)') || exit 2
if [ -n "${MUTANTS:-}" ]; then mutants=$MUTANTS; fi
mutants_run "$mutants" --mutant "$short" "$deep" "$sim" "logic mutants"
