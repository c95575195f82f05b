# Shared by tests/coherence-mutants.sh and tests/logic-mutants.sh: builds the
# simulator, lists the mutants, runs each until a run kills it, and counts.
# Sourced, not run.

# Builds the simulator (RUSTFLAGS=$1, target directory $2 or cargo's own)
# and prints the path of a private copy in $MUTANTS_TMP; exits 2 when the
# build or cargo's report of it fails. The binary is found through cargo,
# so any CARGO_TARGET_DIR works.
mutants_build_sim() {
  local flags=$1 dir=$2 exe
  local args=(build --release --locked -q -p cxlkv-sim --bin cxlkv-sim --message-format=json)
  if [ -n "$dir" ]; then args+=(--target-dir "$dir"); fi
  exe=$(RUSTFLAGS="$flags" cargo "${args[@]}" |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cxlkv-sim":
        print(m["executable"])') || {
    echo "mutants: could not build the simulator" >&2
    exit 2
  }
  if [ -z "$exe" ] || [ ! -x "$exe" ]; then
    echo "mutants: cargo named no simulator binary" >&2
    exit 2
  fi
  # A private copy: rebuilding while this runs must not change the binary.
  cp "$exe" "$MUTANTS_TMP/cxlkv-sim"
  echo "$MUTANTS_TMP/cxlkv-sim"
}

# Prints the names core/src gives with pattern $1 (an ERE whose first
# parenthesised group is the name); exits 2 when a name stands twice.
mutants_names() {
  local all dups
  all=$(grep -rhoE "$1" core/src --include='*.rs' | sed -E "s/$1/\\1/")
  dups=$(printf '%s\n' "$all" | sort | uniq -d)
  if [ -n "$dups" ]; then
    echo "mutants: names used at more than one place:" >&2
    printf '  %s\n' $dups >&2
    exit 2
  fi
  printf '%s\n' "$all" | sort
}

# Runs mutant $1 on seed $2 of configuration $3 (short or deep) with the
# simulator $5, switched by option $4; returns the simulator's status. Odd
# seeds crash a host; seeds 2 and 3 (mod 4) run lazy caches, the others busy
# ones; seeds 4 to 7 (mod 8) run one host more (a lock's waiter can be on
# neither the manager's nor the recovering host); seeds 3 (mod 6) mix block
# sizes up to two chunks. Short runs have 3-4 hosts and 80 operations; deep
# ones 4-5 hosts and 300, for rarer interleavings.
mutants_seed() {
  local m=$1 s=$2 cfg=$3 hosts ops crash= lazy= mixed= feed=1
  # A recorded seed may name the operation after which the change log is
  # read (short/f3: CXLKV_SIM_FEED_AT=3), another family of interleavings.
  case "$cfg" in
    */f[0-3]) feed=${cfg##*/f}; cfg=${cfg%/f*} ;;
  esac
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
  CXLKV_SIM_FEED_AT=$feed "$5" run --seed "$s" --hosts "$hosts" --ops "$ops" $crash $lazy $mixed "$4" "$m" --quiet >/dev/null 2>&1
}
export -f mutants_seed

# One mutant ($1) against the simulator ($5, switched by option $4): first
# the steered scenarios (`cxlkv-sim scenario`), then the seeds recorded for
# it in tests/mutant-seeds (seeds that killed it
# once, deeper than CI's range: replayed like a fuzz corpus), then short
# seeds 1..$2, then deep seeds 1..$3. Prints the verdict; returns 255
# (stopping xargs) when a run ends without one.
mutants_one() {
  local m=$1 s rc cfg n runs
  # The steered scenarios first: each reaches one interleaving on purpose,
  # whatever the seeds' traffic does.
  "$5" scenario "$4" "$m" --quiet >/dev/null 2>&1
  rc=$?
  case $rc in
    0) ;;
    1)
      echo "killed   $m (scenario)"
      return 0
      ;;
    *)
      echo "ABORT    $m (scenario): the simulator exited $rc, not with a verdict" >&2
      return 255
      ;;
  esac
  runs=$(awk -v m="$m" '$1 == m { print $2 " " $3 }' tests/mutant-seeds 2>/dev/null)
  for cfg in short deep; do
    if [ "$cfg" = short ]; then n=$2; else n=$3; fi
    runs+=$'\n'$(seq 1 "$n" | sed "s/^/$cfg /")
  done
  while read -r cfg s; do
    [ -n "$s" ] || continue
    mutants_seed "$m" "$s" "$cfg" "$4" "$5"
    rc=$?
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
  done <<<"$runs"
  echo "SURVIVED $m"
}
export -f mutants_one

# Runs every mutant of $1 (names, one a line) two at a time with option $2,
# short seeds $3, deep seeds $4, simulator $5; prints the verdicts and
# "$6: K killed of N"; exits 0 only when every mutant is killed, 2 when a
# run ended without a verdict.
mutants_run() {
  local out n k want
  out=$(printf '%s\n' $1 | xargs -P 2 -I{} bash -c 'mutants_one "$@"' _ {} "$3" "$4" "$2" "$5") || {
    echo "$6: stopped: a run ended without a verdict" >&2
    exit 2
  }
  out=$(printf '%s\n' "$out" | sort -k2)
  echo "$out"
  n=$(printf '%s\n' "$out" | grep -c .)
  k=$(printf '%s\n' "$out" | grep -c '^killed')
  want=$(printf '%s\n' $1 | grep -c .)
  if [ "$n" -ne "$want" ]; then
    echo "$6: $n verdicts for $want mutants" >&2
    exit 2
  fi
  echo "$6: $k killed of $n"
  [ "$k" -eq "$n" ]
}
