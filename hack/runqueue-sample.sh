#!/usr/bin/env bash
# Samples, once a second for at most SECONDS, how long a process waited for a
# CPU: the machine's CPU pressure (/proc/pressure/cpu, "some" total, µs) and,
# summed over every thread of each process named NAME, the kernel's schedstat
# (/proc/<pid>/task/*/schedstat: ns on a CPU, ns runnable but waiting, time
# slices). Differences between two lines give a window's figures; a latency
# measured inside the process that is of the order of its wait per slice is
# the machine's as much as the process's (docs/bench-runs.md).
#
#   hack/runqueue-sample.sh SECONDS [NAME] > samples.log
#
# Each line: <unix time> psi_some_us=<n> [pid=<p> cpu_ns=<n> wait_ns=<n> slices=<n>]...
# Exits 1 when no process named NAME ran while it sampled.
set -euo pipefail

seconds=${1:?usage: hack/runqueue-sample.sh SECONDS [NAME]}
name=${2:-endpoints-guard}
[ -r /proc/pressure/cpu ] || { echo "runqueue-sample: /proc/pressure/cpu is not readable (a kernel without PSI)" >&2; exit 1; }

end=$(( $(date +%s) + seconds ))
# A name that matches nothing (a binary copied under another name) would
# otherwise leave lines of the machine's pressure alone, with no word why.
seen=0
while [ "$(date +%s)" -lt "$end" ]; do
  psi=$(awk '/^some/ { split($5, total, "="); print total[2] }' /proc/pressure/cpu)
  line="$(date +%s.%N) psi_some_us=$psi"
  pids=$(pgrep -x "$name" || true)
  if [ -n "$pids" ] && [ "$seen" -eq 0 ]; then
    seen=1
    echo "runqueue-sample: sampling the process named $name" >&2
  fi
  for pid in $pids; do
    # A process that exits between pgrep and the read leaves no line.
    stat=$(cat /proc/"$pid"/task/*/schedstat 2>/dev/null \
      | awk '{ cpu += $1; wait += $2; slices += $3 } END { if (NR) printf "%.0f %.0f %.0f\n", cpu, wait, slices }') || true
    if [ -n "$stat" ]; then
      read -r cpu wait slices <<< "$stat"
      line="$line pid=$pid cpu_ns=$cpu wait_ns=$wait slices=$slices"
    fi
  done
  echo "$line"
  sleep 1
done
if [ "$seen" -eq 0 ]; then
  echo "runqueue-sample: no process was named $name (pgrep -x compares it with a process's name: its binary's file name, cut to 15 characters); only the machine's pressure was sampled" >&2
  exit 1
fi
