#!/usr/bin/env bash
# The decode benchmark (benches/hot_path.rs) of this tree against another
# commit's, in one interleaved run: the two builds take turns (A B A B ...)
# and each round's ratio is this tree's criterion estimate over the other's,
# so a machine that slows down meanwhile slows both alike.
#   bench/probes/decode_vs.sh BASE [ROUNDS] [FILTER]
# BASE: a commit (built in a worktree under /tmp, into a target directory
# of its own beside this one's: sharing one mixes up the two builds' build
# script outputs, such as the commit --version names); ROUNDS: 7; FILTER:
# the criterion benchmark, "decode/json object" (a flat JSON object of 3
# fields).
set -euo pipefail
cd "$(dirname "$0")/../.."
base="$1"; rounds="${2:-7}"; filter="${3:-decode/json object}"
target="$(pwd)/${CARGO_TARGET_DIR:-target}"
tree="/tmp/palletd-decode-vs-$(git rev-parse --short "$base")"
[ -d "$tree" ] || git worktree add --detach "$tree" "$base" >/dev/null
exe() { # the hot_path benchmark's executable, built in $1 into $2
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo bench --locked --no-run --bench hot_path \
     --message-format=json 2>/dev/null) \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "hot_path" and m.get("executable"):
        print(m["executable"])'
}
a="$(exe . "$target")"; b="$(exe "$tree" "$target/decode-vs")"
estimate() { # criterion's middle estimate, in ns
  "$1" --bench --warm-up-time 1 --measurement-time 3 --noplot "$filter" 2>&1 \
    | python3 -c 'import re,sys
t = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", sys.stdin.read())
print(float(t.group(1)) * {"ps": 1e-3, "ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6}[t.group(2)])'
}
echo "round  this tree ns  $base ns  ratio"
for i in $(seq "$rounds"); do
  x="$(estimate "$a")"; y="$(estimate "$b")"
  python3 -c "print(f'{$i:5}  {$x:12.1f}  {$y:9.1f}  {$x/$y:.3f}')"
done
