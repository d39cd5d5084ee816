#!/usr/bin/env bash
# Heap profile of endpoints-guard under the benchmark workload: which code
# holds the heap at its peak, in the main process and in the resync process.
#
#   bash hack/heap-profile.sh [SIZE]      # S, M (default) or L
#
# Runs `eg-bench --only endpoints-guard` with short phases and heaptrack's
# preload library in the controller (the wrapper execs, so the bench still
# measures the controller's own pid). Needs heaptrack (Debian: apt-get install
# heaptrack) and zstd. Output: target/heap-profile/<pid>.txt, one per process,
# heap at the peak grouped by the innermost endpoints-guard frame.
set -euo pipefail
# shellcheck source=hack/lib.sh
source "$(dirname "$0")/lib.sh"

size=${1:-M}
out="$root/target/heap-profile"
preload=/usr/lib/heaptrack/libheaptrack_preload.so
interpret=/usr/lib/heaptrack/libexec/heaptrack_interpret
for tool in "$preload" "$interpret"; do
  [ -e "$tool" ] || die "$tool is missing: install heaptrack (Debian: apt-get install heaptrack)"
done
command -v heaptrack_print >/dev/null || die "heaptrack_print is missing: install heaptrack"
command -v zstd >/dev/null || die "zstd is missing (Debian: apt-get install zstd)"

rm -rf "$out"
mkdir -p "$out"
cd "$root"
# heaptrack sees only what goes through malloc: build on the system allocator
# (the shipped binary uses jemalloc, src/main.rs).
cargo build --release --bin endpoints-guard --no-default-features
cargo build --release -p eg-bench --bin eg-bench

wrapper="$out/endpoints-guard"
cat >"$wrapper" <<EOF
#!/bin/sh
exec env LD_PRELOAD=$preload DUMP_HEAPTRACK_OUTPUT=$out/raw.\$\$ $root/target/release/endpoints-guard "\$@"
EOF
chmod +x "$wrapper"

EG_BINARY="$wrapper" SIZE="$size" target/release/eg-bench --only endpoints-guard \
  --churn-secs 10 --steady-secs 10 --resync-secs 20 --out "$out/bench"

for raw in "$out"/raw.*; do
  pid=${raw##*.}
  "$interpret" <"$raw" | zstd -q -c >"$out/$pid.zst"
  heaptrack_print -f "$out/$pid.zst" --print-peaks 0 --print-allocators 0 \
    --print-temporary 0 --print-leaks 0 --flamegraph-cost-type peak \
    -F "$out/$pid.stacks" >/dev/null
  python3 - "$out/$pid.stacks" >"$out/$pid.txt" <<'EOF'
import collections, sys

# Each line: "frame;frame;...;frame bytes", outermost frame first.
by_site = collections.Counter()
total = 0
for line in open(sys.argv[1]):
    stack, _, size = line.rstrip().rpartition(" ")
    total += int(size)
    frames = stack.split(";")
    ours = [f for f in frames if "endpoints_guard" in f]
    site = ours[-1] if ours else "(outside endpoints-guard) " + frames[-1]
    by_site[site[:120]] += int(size)
print(f"heap at peak: {total / 1e6:.2f} MB")
for site, size in by_site.most_common(15):
    print(f"{size / 1e6:8.2f} MB  {site}")
EOF
  rm -f "$raw"
  echo "== process $pid"
  head -8 "$out/$pid.txt"
done
