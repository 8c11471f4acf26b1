#!/usr/bin/env bash
# A throw-away Slurm cluster for tests and CI: one node on loopback, or several in network
# namespaces (FSDPX_SLURM_NODES, below).
#
#   eval "$(tests/slurm/slurm_cluster.sh start WORKDIR)"   # prints: export SLURM_CONF=...
#   srun -n 4 hostname
#   tests/slurm/slurm_cluster.sh status WORKDIR
#   tests/slurm/slurm_cluster.sh stop WORKDIR
#
# Only the `export ...` line goes to stdout; all progress and diagnostics go to stderr.
#
# Everything the cluster writes (slurm.conf, its own munge key and socket, controller state,
# spool, logs, pid files) lives under WORKDIR, and the ports are probed per start, so several
# clusters can run side by side and nothing in /etc is read or edited (with several nodes: the
# cluster's own /etc/netns/NS/hosts files, removed by stop). The one lasting system-wide effect
# is installing the Debian packages when they are missing (that needs root).
#
# With FSDPX_SLURM_NODES=N (N >= 2), the cluster has N nodes fsdpx-n0..: each slurmd runs in
# a network namespace and a UTS namespace of its own (host name fsdpx-nI, address 10.77.0.I+1),
# and slurmctld in a head namespace (fsdpx-head, 10.77.0.254) whose bridge joins the nodes' veth
# pairs. The namespaces, their addresses and their /etc/netns/NS/hosts files are this cluster's
# own; the host's networks are never touched, and stop removes all of it. Clients then run in the
# head namespace:
#   tests/slurm/slurm_cluster.sh exec WORKDIR sbatch ...      # any client command
#   tests/slurm/slurm_cluster.sh node-down WORKDIR I          # SIGKILL every process of node I
#   tests/slurm/slurm_cluster.sh node-up WORKDIR I            # its slurmd again, until it is idle
#   tests/slurm/slurm_cluster.sh counters WORKDIR I           # "RX_BYTES TX_BYTES" of node I's eth0
#   tests/slurm/slurm_cluster.sh procs WORKDIR I              # "PID COMMAND" of node I's processes
#
# Environment knobs (all optional; not named SLURM_* because those are cleared, see below):
#   FSDPX_SLURM_NODES          nodes (default 1: no namespaces, the host's loopback)
#   FSDPX_SLURM_CPUS           CPUs to declare for the node (default: max(nproc, 8)). More than
#                              the machine has is deliberate: `srun -n 4` must work on 2 cores.
#   FSDPX_SLURM_START_TIMEOUT  seconds to wait for the node to become idle (default 60)
#   FSDPX_SLURM_NO_INSTALL=1   never run apt-get; fail if something is missing
set -euo pipefail

readonly PKGS=(slurmctld slurmd slurm-client munge)
readonly START_TIMEOUT=${FSDPX_SLURM_START_TIMEOUT:-60}
readonly PROG=${0##*/}

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() {
  printf 'usage: %s {start|stop|status} WORKDIR | exec WORKDIR CMD... | {node-down|node-up|counters|procs} WORKDIR I\n' "$PROG" >&2
  exit 2
}

[[ $START_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "FSDPX_SLURM_START_TIMEOUT must be a positive integer"
[[ -z ${FSDPX_SLURM_CPUS:-} || ${FSDPX_SLURM_CPUS:-} =~ ^[1-9][0-9]*$ ]] ||
  die "FSDPX_SLURM_CPUS must be a positive integer"
[[ -z ${FSDPX_SLURM_NODES:-} || ${FSDPX_SLURM_NODES:-} =~ ^[1-9]$ ]] ||
  die "FSDPX_SLURM_NODES must be a number of nodes from 1 to 9"
[[ $# -ge 2 ]] || usage
readonly CMD=$1
case $CMD in
  start | stop | status) [[ $# -eq 2 ]] || usage ;;
  exec) [[ $# -ge 3 ]] || usage ;;
  node-down | node-up | counters | procs) [[ $# -eq 3 && $3 =~ ^[0-9]$ ]] || usage ;;
  *) usage ;;
esac
[[ -n $2 ]] || usage
if [[ ! -d $2 ]]; then
  case $CMD in
    start) mkdir -p -- "$2" || die "cannot create WORKDIR $2" ;;
    stop) log "$2 does not exist; nothing to stop"; exit 0 ;;
    *) log "$2 does not exist; no cluster"; exit 1 ;;
  esac
fi
WORKDIR=$(cd -- "$2" && pwd -P)
readonly WORKDIR

readonly CONF=$WORKDIR/slurm.conf
readonly PIDDIR=$WORKDIR/pids
readonly LOGDIR=$WORKDIR/log
# The node count of a running cluster is the one it was started with.
if [[ $CMD != start && -r $WORKDIR/nodes ]]; then NODES=$(<"$WORKDIR/nodes"); else NODES=${FSDPX_SLURM_NODES:-1}; fi
# Namespace names unique to this WORKDIR, so that clusters side by side do not meet.
NETNS=fsdpx$(printf '%s' "$WORKDIR" | md5sum | cut -c1-8)
readonly NETNS

# Clients talk to *this* cluster only. An outer Slurm allocation (CI running on a real cluster)
# would otherwise leak SLURM_JOB_ID etc. into our srun, which would then try to join that job.
for var in $(compgen -e); do
  if [[ $var == SLURM_* ]]; then unset "$var"; fi
done
export SLURM_CONF=$CONF
export PATH=$PATH:/usr/sbin:/sbin  # slurmd, ip: root's tools, also for a caller with a user's PATH

# ---------------------------------------------------------------------------------------------
# process helpers

# Reads the first line of a file into the variable named $1; false if the file is unreadable.
# Not var=$(<file): under `set -e`, bash 5.2 exits outright when that file is missing, even
# inside `|| ...`, and /proc entries and pid files do vanish between our looks.
read_line() {
  printf -v "$1" '%s' ''
  IFS= read -r "$1" 2>/dev/null <"$2" || [[ -n ${!1} ]]
}

# A pid file is only trusted if the process still runs with our WORKDIR on its command line:
# after a reboot or a crash the pid may belong to something else, and we must never kill that.
pid_of() {
  local name=$1 pid
  read_line pid "$PIDDIR/$name.pid" || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  # (no `tr | grep -q` here: with pipefail, grep's early exit can SIGPIPE tr into a failure)
  local cmdline
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmdline == *"$WORKDIR/"* ]] || return 1
  printf '%s\n' "$pid"
}

is_running() { pid_of "$1" >/dev/null; }

# Whether the process exists and is not a zombie. Daemons we launched are our children and we
# never wait for them, so one that died stays a zombie (and `kill -0` succeeds) until we exit.
alive() {
  local stat
  read_line stat "/proc/$1/stat" || return 1
  stat=${stat##*) }   # after "pid (comm) " comes the state; comm may contain spaces
  [[ ${stat:0:1} != Z ]]
}

# For the daemons this very start launched. Not pid_of: while a daemon is between fork and
# exec (twice: setsid, then the daemon), its /proc/PID/cmdline can read empty for a moment.
launched_alive() {
  local pid
  read_line pid "$PIDDIR/$1.pid" || return 1
  alive "$pid"
}

# Starts a daemon in the foreground mode of its own, in the background of ours, in a new
# session (so a Ctrl-C or a CTest timeout that hits our process group does not take it down).
# All inherited fds beyond 0-2 are closed and 0-2 go to files: a daemon holding the pipe of
# `eval "$(slurm_cluster.sh start ...)"` or of CTest open would make the caller hang forever.
launch() {
  local name=$1; shift
  (
    for fd in "/proc/$BASHPID/fd"/*; do
      fd=${fd##*/}
      if [[ $fd -gt 2 ]]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    # setsid execs in place (we are not a group leader), so $! below is the daemon's pid.
    exec setsid "$@" </dev/null >>"$LOGDIR/$name.out" 2>&1
  ) &
  printf '%s\n' "$!" >"$PIDDIR/$name.pid"
}

# Waits (polling) for the process to exit; true if it did within $2 seconds.
wait_exit() {
  local pid=$1 secs=$2 i
  for ((i = 0; i < secs * 10; i++)); do
    alive "$pid" || return 0
    sleep 0.1
  done
  ! alive "$pid"
}

show_logs() {
  local f
  for f in "$LOGDIR"/munged.out "$LOGDIR"/slurmctld.log \
           "$LOGDIR"/slurmctld.out "$LOGDIR"/slurmd*.log "$LOGDIR"/slurmd*.out; do
    [[ -s $f ]] || continue
    printf -- '----- tail %s -----\n' "$f" >&2
    tail -n 25 -- "$f" >&2 || true
  done
}

# Reports the failure with the daemon logs, tears down what was started (a caller whose eval
# got nothing will not call stop) and exits non-zero. The logs stay in WORKDIR.
fail() {
  log "ERROR: $*"
  show_logs
  do_stop >/dev/null 2>&1 || true
  log "ERROR: $* (cluster stopped; logs in $LOGDIR)"
  exit 1
}

# ---------------------------------------------------------------------------------------------
# installation

pkg_installed() {
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

ensure_packages() {
  local missing=() p
  command -v dpkg-query >/dev/null || die "dpkg-query not found: this script needs Debian/Ubuntu"
  for p in "${PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if ((${#missing[@]} == 0)); then return 0; fi

  [[ ${FSDPX_SLURM_NO_INSTALL:-0} != 1 ]] ||
    die "missing packages (${missing[*]}) and FSDPX_SLURM_NO_INSTALL=1"
  [[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); installing them needs root"
  command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and no apt-get"

  log "installing ${missing[*]} with apt-get"
  # Without this, the packages' maintainer scripts would start system-wide munged/slurmd
  # services (with /etc configs we do not want). policy-rc.d exit 101 = "do not start anything".
  # Only created if absent, and removed again right after.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
    # shellcheck disable=SC2064 # expand now: $policy is local
    trap "rm -f '$policy'" EXIT
  fi
  local rc=0
  {
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get -q update >&2 &&
      timeout 600 apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends \
        "${missing[@]}" >&2
  } || rc=$?
  if ((made_policy)); then rm -f "$policy"; trap - EXIT; fi
  ((rc == 0)) || die "apt-get could not install ${missing[*]} (exit $rc; see output above)"
  for p in "${missing[@]}"; do pkg_installed "$p" || die "package $p still not installed"; done
}

# ---------------------------------------------------------------------------------------------
# namespaces (FSDPX_SLURM_NODES >= 2)

multi() { ((NODES > 1)); }
head_ns() { printf '%s-head\n' "$NETNS"; }
node_ns() { printf '%s-n%s\n' "$NETNS" "$1"; }
node_addr() { printf '10.77.0.%s\n' $(($1 + 1)); }
readonly HEAD_ADDR=10.77.0.254

# The command prefix that runs a command in network namespace $1 with host name $2, in the array
# NS_CMD: a UTS namespace of its own, and a private mount namespace where the cluster's hosts file
# is bound over /etc/hosts. Not `ip netns exec`: it remounts /sys, and slurmd then finds no
# /sys/fs/cgroup. nsenter, unshare and the `exec` below all replace the process, so a daemon
# started this way keeps the pid launch() recorded.
ns_cmd() {
  NS_CMD=(nsenter "--net=/run/netns/$1" unshare --uts --mount --propagation private --
          bash -c 'hostname "$0" && mount --bind "$1" /etc/hosts && exec "${@:2}"' "$2" "/etc/netns/$1/hosts")
}
in_ns() {
  ns_cmd "$1" "$2"; shift 2
  "${NS_CMD[@]}" "$@"
}

# A Slurm client command (squeue, sbatch, ...) under a time limit of $1 seconds (0: none): from
# the head namespace when there are several nodes.
client() {
  local secs=$1; shift
  local prefix=()
  if ((secs > 0)); then prefix=(timeout "$secs"); fi
  if multi; then
    ns_cmd "$(head_ns)" fsdpx-head
    prefix+=("${NS_CMD[@]}")
  fi
  "${prefix[@]}" "$@"
}

# Every process in namespace $1, SIGKILLed (the node's slurmd, slurmstepd and tasks).
kill_ns_processes() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ') || pids=""
  if [[ -n ${pids// /} ]]; then
    log "killing the processes of namespace $1: $pids"
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids 2>/dev/null || true
    local p
    for p in $pids; do wait_exit "$p" 5 || log "WARNING: pid $p of $1 survived SIGKILL"; done
  fi
}

netns_down() {
  local ns i
  for ((i = NODES - 1; i >= -1; i--)); do
    if ((i < 0)); then ns=$(head_ns); else ns=$(node_ns "$i"); fi
    if [[ -e /run/netns/$ns ]]; then
      kill_ns_processes "$ns"
      ip netns delete "$ns" 2>/dev/null || log "WARNING: could not delete namespace $ns"
    fi
    rm -rf -- "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true  # only if empty: another user's entries stay
}

# /etc/netns/NS/hosts (where `ip netns exec` looks too), bound over /etc/hosts by ns_cmd: every
# node's name resolves to its namespace address in all of them, and nowhere else.
write_hosts() {
  local ns=$1 i
  mkdir -p -- "/etc/netns/$ns"
  {
    printf '127.0.0.1 localhost\n%s fsdpx-head\n' "$HEAD_ADDR"
    for ((i = 0; i < NODES; i++)); do printf '%s fsdpx-n%s\n' "$(node_addr "$i")" "$i"; done
  } >"/etc/netns/$ns/hosts"
}

# The head namespace holds a bridge; each node's namespace is joined to it by a veth pair whose
# node end is eth0 (its counters are the node's traffic).
# An `ip` command of netns_up; on failure, the cluster is torn down with the command named.
net() {
  local err
  err=$(ip "$@" 2>&1) || fail "'ip $*' failed: $err"
}

netns_up() {
  command -v ip >/dev/null || die "ip (iproute2) not found: the multi-node cluster needs it"
  command -v nsenter >/dev/null || die "nsenter (util-linux) not found: the multi-node cluster needs it"
  local err head i ns
  head=$(head_ns)
  err=$(ip netns add "$head" 2>&1) ||
    fail "the kernel refuses a network namespace ('ip netns add $head': $err); the multi-node cluster needs root and CONFIG_NET_NS"
  net -n "$head" link set lo up
  net -n "$head" link add br0 type bridge
  net -n "$head" addr add "$HEAD_ADDR/24" dev br0
  net -n "$head" link set br0 up
  write_hosts "$head"
  for ((i = 0; i < NODES; i++)); do
    ns=$(node_ns "$i")
    net netns add "$ns"
    net -n "$ns" link set lo up
    net -n "$head" link add "v$i" type veth peer name eth0 netns "$ns"
    net -n "$head" link set "v$i" master br0 up
    net -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    net -n "$ns" link set eth0 up
    write_hosts "$ns"
  done
  in_ns "$(node_ns 0)" fsdpx-n0 getent hosts fsdpx-head >/dev/null ||
    fail "names do not resolve inside the namespaces (/etc/netns/NS/hosts bound over /etc/hosts)"
}

launch_slurmd() {
  if multi; then
    ns_cmd "$(node_ns "$1")" "fsdpx-n$1"
    launch "slurmd-n$1" "${NS_CMD[@]}" slurmd -D -f "$CONF" -N "fsdpx-n$1"
  else
    launch slurmd slurmd -D -f "$CONF"
  fi
}

slurmd_names() {
  local i
  if multi; then for ((i = 0; i < NODES; i++)); do printf 'slurmd-n%s\n' "$i"; done; else echo slurmd; fi
}

# ---------------------------------------------------------------------------------------------
# configuration

# True if something accepts connections on the port (all our daemons listen on 0.0.0.0,
# so loopback sees them). Uses bash's /dev/tcp, so no ss/netstat needed on a fresh machine.
port_busy() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Two adjacent free ports, chosen at random below the Linux ephemeral range (32768+), where
# outgoing connections could grab them between our probe and the daemon's bind.
pick_ports() {
  local i p
  for ((i = 0; i < 200; i++)); do
    p=$((10000 + (RANDOM % 11000) * 2))
    if ! port_busy "$p" && ! port_busy $((p + 1)); then
      CTLD_PORT=$p SLURMD_PORT=$((p + 1))
      return 0
    fi
  done
  die "no free port pair found in 10000-32000"
}

# The paths slurm.conf and munged get. Unix sockets (munge's, slurmstepd's in the spool dir)
# have a 108 byte path limit, CTest work dirs can be deep, and slurm.conf cannot quote spaces.
# For such a WORKDIR, everything goes through a short symlink /tmp/slurmc.XXXXXX -> WORKDIR.
setup_rundir() {
  RUNDIR=$WORKDIR
  if ((${#WORKDIR} > 60)) || [[ ! $WORKDIR =~ ^[A-Za-z0-9_./+-]+$ ]]; then
    local link
    link=$(mktemp -u /tmp/slurmc.XXXXXX)
    ln -s -- "$WORKDIR" "$link" || die "cannot create symlink $link"
    printf '%s\n' "$link" >"$WORKDIR/rundir-link"
    RUNDIR=$link
  fi
}

write_config() {
  local node=$1 cpus mem_mb ctld_host node_lines timeouts min_job_age=30 i
  cpus=${FSDPX_SLURM_CPUS:-$(nproc)}
  ((cpus >= 8)) || [[ -n ${FSDPX_SLURM_CPUS:-} ]] || cpus=8
  # Declared so that --mem requests can be satisfied; 90% of the machine leaves room for us.
  mem_mb=$(awk -v n="$NODES" '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 / n }' /proc/meminfo)
  if multi; then
    ctld_host="fsdpx-head($HEAD_ADDR)"
    node_lines=""
    for ((i = 0; i < NODES; i++)); do
      node_lines+="NodeName=fsdpx-n$i NodeAddr=$(node_addr "$i") NodeHostname=fsdpx-n$i CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN"$'\n'
    done
    node_lines+="PartitionName=debug Nodes=fsdpx-n[0-$((NODES - 1))] Default=YES MaxTime=INFINITE State=UP"
    # A lost node is noticed within 10 s; only jobs submitted with --requeue are requeued then,
    # and a requeued job may start again cred_expire (75 s here, 120 s by default) later. Not
    # less than 60 s: slurmctld resends a kill it could not deliver to a dead node 60 s later
    # (its agent's retry interval), naming only the job and step ids, so a requeued job that
    # was already running again on that node would get it (seen once: the restarted step was
    # SIGKILLed). DebugFlags=Agent logs those retries.
    timeouts="SlurmdTimeout=10"$'\n'"JobRequeue=0"$'\n'"DebugFlags=Agent"
    # A batch job starts within a second of its submission or of its begin time (by default,
    # up to 3 s later, batch_sched_delay, and a requeued one up to 30 s, bf_interval); cheap
    # with two nodes and a few jobs. And a job's record outlives its end by 5 minutes, so that
    # a test may look at a job that ended while it was busy with another.
    timeouts+=$'\n'"SchedulerParameters=batch_sched_delay=0,bf_interval=1"
    min_job_age=300
  else
    ctld_host="$node(127.0.0.1)"
    node_lines="NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN"$'\n'
    node_lines+="PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP"
    timeouts="SlurmdTimeout=60"
  fi

  cat >"$CONF" <<EOF
# Generated by $PROG for a throw-away test cluster; edits are lost on the next start.
ClusterName=fsdpx-test
# NodeAddr/ControlAddr 127.0.0.1: works even if the host name does not resolve.
SlurmctldHost=$ctld_host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root

# Our own munged (see start): both authentication and job credentials go through its socket.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$RUNDIR/munge/munge.socket$(multi && echo ",cred_expire=75")

StateSaveLocation=$RUNDIR/state
SlurmdSpoolDir=$RUNDIR/spool/%n
SlurmctldPidFile=$RUNDIR/pids/slurmctld.own.pid
SlurmdPidFile=$RUNDIR/pids/slurmd-%n.own.pid
SlurmctldLogFile=$RUNDIR/log/slurmctld.log
SlurmdLogFile=$RUNDIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups, no systemd: containers and VMs often have neither (or cgroup v1 only).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
# The default (/bin/mail) is usually missing, and slurmctld logs an error for that.
MailProg=/bin/true

SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node declares more CPUs than it has (oversubscription for tests); without this slurmd
# would register the real hardware and the node would be drained for "low CPU count".
SlurmdParameters=config_overrides
ReturnToService=2

# Short timeouts: tests want fast failures and fast teardown, not resilience.
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=$min_job_age
SlurmctldTimeout=30
$timeouts

$node_lines
EOF
}

# ---------------------------------------------------------------------------------------------
# commands

do_status() {
  local d pid any=0 all=1
  for d in munged slurmctld $(slurmd_names); do
    if pid=$(pid_of "$d"); then
      log "$d running (pid $pid)"; any=1
    else
      log "$d not running"
    fi
  done
  ((any)) || return 1
  if is_running slurmctld; then client 15 sinfo -N -l >&2 || true; fi
  for d in munged slurmctld $(slurmd_names); do is_running "$d" || all=0; done
  ((all))
}

# SIGTERM to the given daemons, then wait for all of them; SIGKILL for those that linger.
stop_daemons() {
  local d pid pids=() names=() i
  for d in "$@"; do
    if pid=$(pid_of "$d"); then
      log "stopping $d (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid") names+=("$d")
    fi
  done
  for i in "${!pids[@]}"; do
    if ! wait_exit "${pids[i]}" 15; then
      log "${names[i]} did not exit after SIGTERM; sending SIGKILL"
      kill -KILL "${pids[i]}" 2>/dev/null || true
      wait_exit "${pids[i]}" 5 || log "WARNING: ${names[i]} (pid ${pids[i]}) survived SIGKILL"
    fi
  done
  for d in "$@"; do rm -f "$PIDDIR/$d.pid"; done
}

# A pid and all its descendants, from the parent pids in /proc/*/stat (/proc/PID/task/*/children
# would be simpler but needs CONFIG_PROC_CHILDREN, which e.g. this project's VMs lack).
descendants() {
  local -A kids=()
  local dir stat ppid p c queue=("$1")
  for dir in /proc/[0-9]*; do
    read_line stat "$dir/stat" || continue
    stat=${stat##*) }          # after "pid (comm) ": "state ppid ..."; comm may hold spaces
    ppid=${stat#* } ppid=${ppid%% *}
    kids[$ppid]+="${dir#/proc/} "
  done
  while ((${#queue[@]})); do
    p=${queue[0]} queue=("${queue[@]:1}")
    printf '%s\n' "$p"
    for c in ${kids[$p]:-}; do queue+=("$c"); done
  done
}

# Step daemons of *this* cluster that survived (slurmctld was dead, so scancel could not reach
# them), with the tasks they started. They are recognised by our slurm.conf in their environment
# (slurmd passes its own on). Scans /proc directly: pgrep (procps) is not on every minimal image.
kill_leftover_steps() {
  local dir pid comm environ
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    read_line comm "$dir/comm" || continue
    [[ $comm == slurmstepd ]] || continue
    environ=$(tr '\0' '\n' 2>/dev/null <"$dir/environ") || continue
    grep -qxF "SLURM_CONF=$CONF" <<<"$environ" || continue
    log "killing leftover slurmstepd $pid and its tasks"
    # shellcheck disable=SC2046 # one pid per word
    kill -KILL $(descendants "$pid") 2>/dev/null || true
  done
}

do_stop() {
  # Ask the controller to end all jobs first: slurmstepd (which runs job steps) outlives slurmd
  # by design, so killing the daemons alone would leave the job's processes behind.
  if is_running slurmctld && is_running munged; then
    local jobs
    jobs=$(client 15 squeue -h -o %i 2>/dev/null) || jobs=""
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086 # one job id per word
      client 15 scancel --quiet $jobs 2>/dev/null || true
      local i
      for ((i = 0; i < 40; i++)); do
        [[ -z $(client 5 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
        sleep 0.25
      done
    fi
  fi
  # Each daemon takes 1-2 s to shut down, so the slurm daemons go at once; munged last, as
  # they may still need it while shutting down.
  # shellcheck disable=SC2046 # one name per word
  stop_daemons $(slurmd_names) slurmctld
  stop_daemons munged
  kill_leftover_steps
  if multi; then netns_down; fi
  if [[ -r $WORKDIR/rundir-link ]]; then
    local link
    if read_line link "$WORKDIR/rundir-link" && [[ -L $link ]]; then rm -f -- "$link"; fi
    rm -f -- "$WORKDIR/rundir-link"
  fi
  return 0
}

# fd 3 is the real stdout (see the start case below).
print_env() {
  printf 'export SLURM_CONF=%q\n' "$CONF" >&3
}

# Waits until node $1 is idle (or mixed or allocated: up, and already given a job that waited
# for it); fails with its state otherwise.
wait_idle() {
  local node=$1 daemon=$2 state="" deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    launched_alive slurmctld || fail "slurmctld exited"
    launched_alive "$daemon" || fail "$daemon exited during startup"
    state=$(client 5 sinfo -h -N -n "$node" -o %T 2>/dev/null) || state=""
    state=${state%%$'\n'*}
    [[ $state =~ ^(idle|mixed|allocated)$ ]] && return 0
    sleep 0.5
  done
  client 10 scontrol show node "$node" >&2 || true
  fail "node $node not idle after ${START_TIMEOUT} s (state: '${state:-no answer from slurmctld}')"
}

do_start() {
  local t0=$SECONDS want=$NODES
  if [[ -r $WORKDIR/nodes ]]; then NODES=$(<"$WORKDIR/nodes"); fi  # what runs now, if anything
  if ((NODES == want)) && do_status 2>/dev/null; then
    log "cluster in $WORKDIR is already running"
    print_env
    return 0
  fi
  # Half a cluster (crash, killed test) is not worth repairing: start from scratch.
  do_stop 2>/dev/null || true
  NODES=$want
  printf '%s\n' "$NODES" >"$WORKDIR/nodes"

  ensure_packages
  local b
  for b in munged munge unmunge slurmctld slurmd srun sinfo scontrol squeue scancel; do
    command -v "$b" >/dev/null || die "$b not found although its package is installed"
  done

  local node
  node=$(hostname -s 2>/dev/null || hostname)
  [[ -n $node ]] || die "cannot determine the host name"
  # srun tells slurmd where to send task I/O based on the host name; warn early if it cannot
  # resolve (fix: add "127.0.0.1 $node" to /etc/hosts).
  getent hosts "$node" >/dev/null || log "WARNING: host name '$node' does not resolve; srun may fail"

  rm -rf -- "$WORKDIR/state" "$WORKDIR/spool" "$WORKDIR/munge" "$LOGDIR" "$PIDDIR"
  mkdir -p -- "$WORKDIR/state" "$WORKDIR/spool" "$WORKDIR/munge" "$LOGDIR" "$PIDDIR"
  local i
  if multi; then
    for ((i = 0; i < NODES; i++)); do mkdir -p -- "$WORKDIR/spool/fsdpx-n$i"; done
  else
    mkdir -p -- "$WORKDIR/spool/$node"
  fi
  # munged refuses a key in a directory others can write to, and warns unless all users can
  # reach its socket (jobs may run as non-root users).
  chmod 755 -- "$WORKDIR/munge"
  setup_rundir
  pick_ports
  write_config "$node"
  if multi; then
    log "config $CONF ($NODES nodes fsdpx-n0.. in namespaces $NETNS-*, slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT)"
  else
    log "config $CONF (node $node, slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT)"
  fi

  # --- munge: a private key and daemon, so neither /etc/munge/munge.key nor /run/munge is
  # needed, and a system munged, if any, is left alone. In --foreground it logs to stderr, i.e.
  # log/munged.out. --force: munged refuses to start if any directory above its files is group-
  # or world-writable without the sticky bit (umask 002 CI checkouts); a test does not care.
  local mdir=$RUNDIR/munge
  head -c 1024 /dev/urandom >"$mdir/munge.key"
  chmod 600 "$mdir/munge.key"
  launch munged munged --foreground --force \
    --key-file="$mdir/munge.key" --socket="$mdir/munge.socket" \
    --pid-file="$PIDDIR/munged.own.pid" \
    --seed-file="$mdir/munge.seed"
  local i ok=0
  for ((i = 0; i < 100; i++)); do
    launched_alive munged || fail "munged exited during startup"
    if [[ -S $mdir/munge.socket ]] &&
      timeout 5 munge -n -S "$mdir/munge.socket" 2>/dev/null |
      timeout 5 unmunge -S "$mdir/munge.socket" >/dev/null 2>&1; then
      ok=1; break
    fi
    sleep 0.1
  done
  ((ok)) || fail "munged did not answer on $mdir/munge.socket within 10 s"

  # --- slurm daemons, in the foreground mode so that the pid we record is the daemon's.
  if multi; then
    netns_up
    ns_cmd "$(head_ns)" fsdpx-head
    launch slurmctld "${NS_CMD[@]}" slurmctld -D -f "$CONF"
    for ((i = 0; i < NODES; i++)); do launch_slurmd "$i"; done
    for ((i = 0; i < NODES; i++)); do wait_idle "fsdpx-n$i" "slurmd-n$i"; done
  else
    launch slurmctld slurmctld -D -f "$CONF"
    launch_slurmd
    wait_idle "$node" slurmd
  fi

  # --- a real job step proves munge credentials, slurmd<->srun I/O and the spool dir work
  # (on every node: one task each).
  local out got want smoke=(-n 2)
  if multi; then smoke=(-N "$NODES" -n "$NODES"); fi
  out=$(client 60 srun "${smoke[@]}" -t 1 hostname 2>&1) ||
    fail "smoke test 'srun ${smoke[*]} hostname' failed: $(tr '\n' ' ' <<<"$out")"
  if multi; then  # each task on its own node, under that node's host name
    got=$(sort <<<"$out" | tr '\n' ' ')
    want=$(for ((i = 0; i < NODES; i++)); do printf 'fsdpx-n%s ' "$i"; done)
  else
    got=$(grep -c . <<<"$out") want=2
  fi
  [[ $got == "$want" ]] ||
    fail "smoke test 'srun ${smoke[*]} hostname' printed '$(tr '\n' ' ' <<<"$out")', expected $want"

  log "cluster up in $((SECONDS - t0)) s: export SLURM_CONF=$CONF"
  print_env
}

case $CMD in
  start)
    # One start/stop at a time per WORKDIR. The lock fd is closed in launch(), so daemons
    # do not inherit (and hold) it.
    exec 9>"$WORKDIR/.lock"
    flock -w 180 9 || die "another $PROG holds $WORKDIR/.lock"
    # Only the export line may reach stdout (the caller evals it): everything else, including
    # apt-get's chatter, goes to stderr; print_env writes to the saved stdout on fd 3.
    exec 3>&1 1>&2
    do_start
    ;;
  stop)
    exec 9>"$WORKDIR/.lock"
    flock -w 180 9 || die "another $PROG holds $WORKDIR/.lock"
    do_stop
    log "stopped (logs kept in $LOGDIR)"
    ;;
  status)
    if do_status; then exit 0; else exit 1; fi
    ;;
  exec)
    shift 2
    client 0 "$@"
    ;;
  node-down | node-up | counters | procs)
    multi || die "$CMD needs a cluster of several nodes (FSDPX_SLURM_NODES at start)"
    (($3 < NODES)) || die "node $3 does not exist: the cluster has nodes 0-$((NODES - 1))"
    case $CMD in
      node-down) kill_ns_processes "$(node_ns "$3")"; rm -f "$PIDDIR/slurmd-n$3.pid" ;;
      node-up)
        exec 9>"$WORKDIR/.lock"
        flock -w 180 9 || die "another $PROG holds $WORKDIR/.lock"
        launch_slurmd "$3"
        wait_idle "fsdpx-n$3" "slurmd-n$3"
        ;;
      procs)
        for p in $(ip netns pids "$(node_ns "$3")"); do
          if read_line comm "/proc/$p/comm"; then printf '%s %s\n' "$p" "$comm"; fi
        done
        ;;
      counters)
        ip netns exec "$(node_ns "$3")" cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes |
          tr '\n' ' ' | sed 's/ $/\n/'
        ;;
    esac
    ;;
esac
