#!/usr/bin/env bash
# Coherence mutants: disables each flush, invalidate and fence call site of
# core in turn and runs the simulator harness until a run finds a violation
# (the mutant is killed, with the seed that killed it) or the seeds run out
# (it survived). Exits 0 only when every mutant is killed.
#
#   tests/coherence-mutants.sh [SHORT [DEEP]]  (default 8 short seeds, 16 deep)
#   SITES="a b" tests/coherence-mutants.sh     (only these sites)
#
# A site that survives the short configuration (3-4 hosts, 80 operations)
# meets the deep one (4-5 hosts, 300 operations); seeds choose crashes, lazy
# caches and mixed sizes (tests/lib/mutants.sh). A mutant counts as killed
# only when the simulator exits with its violation status (1); any other
# outcome (it could not run, crashed, was killed) stops the check with
# status 2. The simulator is found through cargo (any CARGO_TARGET_DIR).
#
# Sites named `*.hint` are left out: they only make a later locked (or
# second, fresh) read more likely to succeed, so removing one cannot change
# any outcome; each says so in its SYNC comment. So are `*.report` sites,
# whose fresh reads feed only a count in a report.
set -uo pipefail
cd "$(dirname "$0")/.."
. tests/lib/mutants.sh
short=${1:-8}
deep=${2:-16}
MUTANTS_TMP=$(mktemp -d)
trap 'rm -rf "$MUTANTS_TMP"' EXIT
sim=$(mutants_build_sim "" "") || exit 2
# Every site name in core's non-test code (names have a dot; test-only sites
# such as Site("t") do not). Core's build refuses duplicates; so does this.
sites=$(mutants_names 'Site\("([a-z_]+\.[a-z_.]+)"\)') || exit 2
sites=$(printf '%s\n' "$sites" | grep -v -E '\.(hint|report)$')
if [ -n "${SITES:-}" ]; then sites=$SITES; fi
mutants_run "$sites" --disable "$short" "$deep" "$sim" "coherence mutants"
