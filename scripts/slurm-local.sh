#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for CI and for trying `hydra/launcher=slurm` locally.
#   scripts/slurm-local.sh start     install (Debian packages) if needed, configure, start; wait until the node is idle;
#                                    print the hydra.launcher keys of a request that fits the node (it has no GPU)
#   scripts/slurm-local.sh stop      stop slurmd, slurmctld and munged (only the ones this script started)
#   scripts/slurm-local.sh status    print the node's state; exit 0 if it is up
# Idempotent: `start` on a running cluster only checks it. Needs root (apt-get, daemons). On failure it prints one
# line starting with "slurm-local:" and exits non-zero. Never overwrites a slurm.conf it did not write.
set -uo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARKER="# written by peltbench scripts/slurm-local.sh"
STATE=/var/lib/peltbench-slurm          # pid files, spool and state dirs, logs
LOGS=$STATE/log
NODE=$(hostname -s)
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}

fail() { echo "slurm-local: $*" >&2; exit 1; }
say() { echo "slurm-local: $*"; }

alive() {  # alive PIDFILE: the process named in PIDFILE is running
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() { sinfo -h -n "$NODE" -o %t 2>/dev/null | head -n1; }

fits() {  # the launcher keys of a request this node can run (the default, 4 CPUs, 32 GB and 1 GPU, may not fit)
    local cpus memory
    read -r cpus memory < <(sinfo -h -n "$NODE" -o "%c %m" 2>/dev/null | head -n1)
    echo "hydra.launcher.gpus_per_node=0 hydra.launcher.cpus_per_task=$(( cpus < 4 ? cpus : 4 )) hydra.launcher.mem_gb=$(( memory / 1024 < 32 ? memory / 1024 : 32 ))"
}

install_packages() {
    local missing=()
    for tool in slurmctld slurmd sinfo munged; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || fail "not installed (${missing[*]}) and not root: apt-get install slurmctld slurmd slurm-client munge"
    command -v apt-get >/dev/null || fail "not installed (${missing[*]}) and no apt-get on this machine"
    say "installing slurmctld slurmd slurm-client munge"
    local packages=(slurmctld slurmd slurm-client munge)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >"$STATE/apt.log" 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$STATE/apt.log" 2>&1 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >>"$STATE/apt.log" 2>&1 \
            || fail "apt-get install failed (see $STATE/apt.log)"
    fi
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    alive /run/munge/munged.pid && return 0
    runuser -u munge -- /usr/sbin/munged --force || fail "munged did not start (see /var/log/munge/munged.log)"
    for _ in $(seq 20); do munge -n </dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.25; done
    fail "munged started but munge -n | unmunge fails"
}

write_conf() {
    if [[ -f $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
        fail "$CONF exists and was not written by this script; not touching it"
    fi
    local cpus memory
    cpus=$(nproc)
    memory=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10 ))  # MB, leave 10% to the OS
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$LOGS"
    cat >"$CONF.tmp" <<EOF
$MARKER
ClusterName=peltbench
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120): short, so tests are quick.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5   # a requeued job starts within seconds of becoming eligible
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
KillWait=5
MinJobAge=60
NodeName=$NODE CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

start() {
    mkdir -p "$STATE"
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && [[ $(node_state) == idle* || $(node_state) == mix* || $(node_state) == alloc* ]]; then
        say "already running: node $NODE $(node_state); a request that fits it: $(fits)"
        return 0
    fi
    install_packages
    start_munge
    write_conf
    alive "$STATE/slurmctld.pid" || slurmctld || fail "slurmctld did not start (see $LOGS/slurmctld.log)"
    alive "$STATE/slurmd.pid" || slurmd || fail "slurmd did not start (see $LOGS/slurmd.log)"
    local state=""
    for _ in $(seq $((WAIT_S * 2))); do
        state=$(node_state)
        case $state in
            idle*|mix*|alloc*) say "running: node $NODE $state (sinfo); a request that fits it: $(fits)"; return 0 ;;
            down*|drain*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 ;;
        esac
        sleep 0.5
    done
    fail "node $NODE not idle after ${WAIT_S}s (state '${state:-none}'; see $LOGS/)"
}

stop() {
    local stopped=0
    if alive "$STATE/slurmctld.pid" || alive "$STATE/slurmd.pid"; then
        scancel --user="$(id -un)" >/dev/null 2>&1
        scontrol shutdown >/dev/null 2>&1
        for _ in $(seq 40); do
            alive "$STATE/slurmctld.pid" || alive "$STATE/slurmd.pid" || break
            sleep 0.25
        done
        for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do
            alive "$pidfile" && kill "$(cat "$pidfile")"
        done
        stopped=1
    fi
    if alive /run/munge/munged.pid; then
        kill "$(cat /run/munge/munged.pid)"
        stopped=1
    fi
    if [[ $stopped -eq 1 ]]; then say "stopped"; else say "not running"; fi
}

status() {
    if ! command -v sinfo >/dev/null; then say "not installed"; return 1; fi
    local state
    state=$(node_state)
    if [[ $state == idle* || $state == mix* || $state == alloc* ]]; then say "running: node $NODE $state"; return 0; fi
    say "not running (node state '${state:-none}')"
    return 1
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
