#!/usr/bin/env bash
# Locust against a local zdmq cluster, with the CPU of both sides beside the rates.
#
#   loadtest/run_locust.sh [--nodes 4] [--replication 1] [--durability fsync|os] [-u 50] [-r 50] [-t 20s]
#                          [--processes 2] [--out DIR] [--no-metrics] [--kill-leader S]
#                          [LOCUSTFILE OPTIONS...]
#
#   --processes P: Locust's worker processes (P > 1), or 1 for a single process.
#   --no-metrics: do not check the nodes' /metrics (by default every node's is read and
#     parsed once a second as Locust runs; its counters must move, and after the run its
#     depth and in-flight gauges must equal every queue's stats: metrics.json).
#   --kill-leader S: S seconds in, kill -9 the node that leads the most replica groups
#     (--replication 2 or more); it is started again 3 s later, as systemd would with
#     RestartSec=3, and its groups' other members must show a leader change and an
#     election within the election timeout, plus one read of the metrics. (The CPU
#     accounts count the killed node's process until its kill, not the new one.)
#   e.g. loadtest/run_locust.sh -t 15s --mix push=1,pop=1,recv_ack=1 --routing zerohop
#        loadtest/run_locust.sh --replication 3 -t 20s --kill-leader 8 --routing zerohop
#
# Starts a fresh cluster of N nodes on loopback ports the kernel picks (its own temporary
# directory), waits for every node's READY line, runs Locust headless against it
# (loadtest/locustfile.py; every option not listed above goes to it: --mix, --routing,
# --message-size, --batch-size, --queues, or Locust's own), then stops the nodes by pid,
# also on Ctrl-C or an error. Results land in loadtest/results/locust-<timestamp>/:
#   locust_stats.csv, locust_failures.csv, ... (Locust's CSV), locust.json (its final
#   stats, which the summary reads), report.html,
#   cpu.json (CPU seconds of the nodes and of Locust; cpu_samples.json its timeline),
#   summary.json, cluster.json (the nodes' pids and urls), metrics.json, node-logs/.
# Exits with Locust's status (1 when any request failed), 3 when Locust passed and the
# metrics checks did not, 130 after a Ctrl-C. After a Ctrl-C with --processes, Locust's
# statistics may miss the workers' last reports; the messages the nodes counted (in the
# summary and cpu.json) do not.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-$root/.venv/bin/python}"
locust_bin="${LOCUST:-$(dirname "$py")/locust}"

nodes=4
replication=1
durability=fsync
users=50
rate=50
run_time=20s
processes=2
out=""
metrics=1
kill_leader=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --replication) replication="$2"; shift 2 ;;
    --durability) durability="$2"; shift 2 ;;
    -u|--users) users="$2"; shift 2 ;;
    -r|--spawn-rate) rate="$2"; shift 2 ;;
    -t|--run-time) run_time="$2"; shift 2 ;;
    --processes) processes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-metrics) metrics=0; shift ;;
    --kill-leader) kill_leader="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) extra+=("$1"); shift ;;
  esac
done
case "$durability" in fsync|os|memory) ;; *) echo "--durability: fsync, os or memory" >&2; exit 2 ;; esac
if [[ -n "$kill_leader" ]] && ((replication < 2 || metrics == 0)); then
  echo "--kill-leader needs --replication 2 or more, and the metrics checks" >&2
  exit 2
fi
if [[ ! -x "$locust_bin" ]]; then
  echo "locust is not installed: $root/.venv/bin/pip install -e '.[load]'" >&2
  exit 2
fi

out="${out:-$root/loadtest/results/locust-$(date +%Y%m%dT%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/zdmq-locust.XXXXXX")"
state="$work/cluster.json"
cluster_pid=""

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$cluster_pid" ]]; then
    kill -TERM "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
    # Should the helper have died without stopping them, stop the nodes it started.
    if [[ -s "$state" ]]; then
      for pid in $("$py" -c 'import json,sys; print(*json.load(open(sys.argv[1]))["nodes"].values())' "$state"); do
        kill -TERM "$pid" 2>/dev/null || true
      done
    fi
  fi
  if [[ -s "$state" ]]; then
    cp "$state" "$out/cluster.json"
  fi
  if [[ -d "$work/cluster/logs" ]]; then
    cp -r "$work/cluster/logs" "$out/node-logs" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
# Ctrl-C: Locust stops its users and writes its reports; then the summary, then cleanup.
interrupted=0
trap 'interrupted=1' INT
trap 'exit 143' TERM

cd "$root"
restart=()
if [[ -n "$kill_leader" ]]; then
  # After the election timeout, so that the other members elect a leader meanwhile.
  restart=(--restart 3)
fi
"$py" loadtest/locust_report.py cluster --dir "$work/cluster" --nodes "$nodes" \
  --replication "$replication" --durability "$durability" --state "$state" "${restart[@]}" \
  >"$work/cluster.out" 2>"$work/cluster.err" &
cluster_pid=$!

# Wait for the READY line (the helper prints it once every node printed its own).
deadline=$((SECONDS + 90))
until grep -q '^READY ' "$work/cluster.out" 2>/dev/null; do
  if ! kill -0 "$cluster_pid" 2>/dev/null; then
    echo "the cluster did not start:" >&2
    cat "$work/cluster.err" >&2
    exit 1
  fi
  if ((interrupted)); then
    exit 130
  fi
  if ((SECONDS > deadline)); then
    echo "the cluster was not ready within 90 s" >&2
    exit 1
  fi
  sleep 0.1
done
if ((interrupted)); then
  exit 130
fi
config="$(sed -n 's/^READY //p' "$work/cluster.out")"
echo "cluster: $nodes nodes, replication $replication, durability $durability ($config)"

locust_args=(
  "$locust_bin" -f "$here/locustfile.py" --headless --only-summary
  -u "$users" -r "$rate" -t "$run_time"
  --csv "$out/locust" --html "$out/report.html" --json-file "$out/locust"
  --zdmq-config "$config"
)
if ((processes > 1)); then
  locust_args+=(--processes "$processes")
fi
locust_args+=("${extra[@]}")
printf '%q ' "${locust_args[@]}" >"$out/command.txt"
echo >>"$out/command.txt"

watch=()
if ((metrics)); then
  watch=(--metrics "$out/metrics.json")
  if [[ -n "$kill_leader" ]]; then
    watch+=(--kill-leader "$kill_leader")
  fi
fi
rc=0
"$py" loadtest/locust_report.py run --state "$state" --cpu "$out/cpu.json" "${watch[@]}" -- \
  "${locust_args[@]}" >"$out/locust.log" 2>&1 || rc=$?
echo "locust exited with $rc (log: $out/locust.log)"
if ((metrics)); then
  sed -n '/^metrics: /,/^  metrics checks: /p' "$out/locust.log"
fi
if [[ -f "$out/locust.json" ]]; then
  "$py" loadtest/locust_report.py summary --csv "$out/locust" --cpu "$out/cpu.json" \
    --json "$out/summary.json"
else
  tail -n 30 "$out/locust.log" >&2
fi
echo "results: $out"
if ((interrupted)); then
  exit 130
fi
exit "$rc"
