#!/usr/bin/env bash
# A one-node Slurm (munge, slurmctld, slurmd) and an sshd "login node" on
# localhost, for the Slurm backend's tests. Needs root and Debian's packages
# slurmctld slurmd slurm-client munge openssh-server.
#
#   tests/slurm/cluster.sh up DIR     start everything (idempotent); writes DIR/env
#   tests/slurm/cluster.sh down DIR   stop everything DIR's `up` started
#   tests/slurm/cluster.sh ctld-stop DIR | ctld-start DIR   (tests: slurmctld away)
#
# DIR/env exports SLURM_CONF and JOBSUP_TEST_SLURM=DIR (the tests' switch).
# SSH: DIR/ssh/config has the host aliases jobsup-slurm (as root) and
# jobsup-slurm-citest (as the user citest, created when missing), both on
# 127.0.0.1:$SSH_PORT with a throwaway key. Ports: JOBSUP_SLURM_CTLD_PORT
# (16817), JOBSUP_SLURM_SLURMD_PORT (16818), JOBSUP_SLURM_SSH_PORT (22022).
# The node: JOBSUP_SLURM_CPUS (8) and JOBSUP_SLURM_MEMORY_MB (4000), whatever
# the machine has (config_overrides), e.g. 128 CPUs for 100 jobs at once.
# Cgroups are not used (proctrack/linuxproc, task/none); no slurmdbd: sacct -c
# reads the jobcomp file.
set -euo pipefail

cmd=${1:?usage: cluster.sh up|down|ctld-stop|ctld-start DIR}
D=${2:?usage: cluster.sh $cmd DIR}
CTLD_PORT=${JOBSUP_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${JOBSUP_SLURM_SLURMD_PORT:-16818}
SSH_PORT=${JOBSUP_SLURM_SSH_PORT:-22022}
CPUS=${JOBSUP_SLURM_CPUS:-8}
MEMORY_MB=${JOBSUP_SLURM_MEMORY_MB:-4000}
NODE=jobsupnode
TEST_USER=citest

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {  # stop the process whose pid is in $1 (TERM, then KILL after 5 s)
    local f=$1 pid i
    alive "$f" || { rm -f "$f"; return 0; }
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
}

start_ctld() {
    alive "$D/slurmctld.bgpid" && return 0
    SLURM_CONF=$D/slurm.conf setsid slurmctld -D >>"$D/log/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$D/slurmctld.bgpid"
}

wait_idle() {
    local i
    for i in $(seq 150); do
        case "$(SLURM_CONF=$D/slurm.conf timeout 5 sinfo -h -o %t 2>/dev/null)" in idle|mix|alloc) return 0 ;; esac
        sleep 0.2
    done
    echo "cluster.sh: the node did not come up; logs in $D/log" >&2
    tail -n 20 "$D"/log/*.log >&2 || true
    return 1
}

up() {
    mkdir -p "$D"; chmod 755 "$D"; D=$(cd "$D" && pwd)
    if [ -f "$D/env" ] && alive "$D/slurmctld.bgpid" && alive "$D/slurmd.bgpid" && alive "$D/munge/munged.pid" \
        && alive "$D/ssh/sshd.pid"; then
        wait_idle && return 0
    fi
    # munge: its own key and socket; the socket's folder needs o+x.
    mkdir -p "$D/munge" && chmod 711 "$D/munge"
    [ -f "$D/munge/munge.key" ] || mungekey -c -k "$D/munge/munge.key"
    if ! alive "$D/munge/munged.pid"; then
        munged -S "$D/munge/munge.sock" --key-file="$D/munge/munge.key" --pid-file="$D/munge/munged.pid" \
            --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" --force
    fi
    # 4 fake GPUs: gres/gpu wants character devices.
    mkdir -p "$D/dev"
    for i in 0 1 2 3; do [ -e "$D/dev/nvidia$i" ] || mknod "$D/dev/nvidia$i" c 195 "$i"; done
    mkdir -p "$D/state" "$D/spool/$NODE" "$D/log"
    [ -f "$D/log/jobcomp.txt" ] || install -m 644 /dev/null "$D/log/jobcomp.txt"
    cat >"$D/slurm.conf" <<CONF
ClusterName=jobsupci
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=200
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
MinJobAge=300
KillWait=5
ReturnToService=2
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
DependencyParameters=kill_invalid_depend
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$NODE NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY_MB Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=tiny Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
CONF
    echo "NodeName=$NODE Name=gpu File=$D/dev/nvidia[0-3]" >"$D/gres.conf"
    start_ctld
    if ! alive "$D/slurmd.bgpid"; then
        SLURM_CONF=$D/slurm.conf setsid slurmd -D -N "$NODE" >>"$D/log/slurmd.out" 2>&1 </dev/null &
        echo $! >"$D/slurmd.bgpid"
    fi
    wait_idle

    # sshd on 127.0.0.1:$SSH_PORT, keys and authorized_keys in $D/ssh.
    id "$TEST_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$TEST_USER"
    usermod -p '*' "$TEST_USER"  # useradd leaves the account locked: sshd would refuse the key
    local S=$D/ssh
    mkdir -p "$S" /run/sshd && chmod 755 "$S"
    [ -f "$S/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$S/host_key"
    [ -f "$S/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$S/id_ed25519"
    install -m 644 "$S/id_ed25519.pub" "$S/authorized_keys"
    echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$S/host_key.pub")" >"$S/known_hosts"
    cat >"$S/sshd_config" <<CONF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $S/host_key
PidFile $S/sshd.pid
AuthorizedKeysFile $S/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxSessions 100
MaxStartups 100:30:200
SetEnv SLURM_CONF=$D/slurm.conf
CONF
    alive "$S/sshd.pid" || /usr/sbin/sshd -f "$S/sshd_config" -E "$S/sshd.log"
    cat >"$S/config" <<CONF
Host jobsup-slurm jobsup-slurm-citest
    HostName 127.0.0.1
    Port $SSH_PORT
    IdentityFile $S/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $S/known_hosts
    StrictHostKeyChecking yes
Host jobsup-slurm
    User root
Host jobsup-slurm-citest
    User $TEST_USER
CONF
    for i in $(seq 50); do
        ssh -F "$S/config" -o BatchMode=yes jobsup-slurm-citest true 2>/dev/null && break
        sleep 0.1
    done
    ssh -F "$S/config" -o BatchMode=yes jobsup-slurm-citest 'sinfo -h -o %t' >/dev/null
    printf 'export SLURM_CONF=%s\nexport JOBSUP_TEST_SLURM=%s\n' "$D/slurm.conf" "$D" >"$D/env"
    echo "cluster.sh: Slurm and sshd up in $D (source $D/env)"
}

down() {
    [ -d "$D" ] || return 0
    rm -f "$D/env"
    stop_pidfile "$D/ssh/sshd.pid"
    stop_pidfile "$D/slurmd.bgpid"
    stop_pidfile "$D/slurmctld.bgpid"
    stop_pidfile "$D/munge/munged.pid"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    ctld-stop) stop_pidfile "$D/slurmctld.bgpid" ;;
    ctld-start) start_ctld; wait_idle ;;
    *) echo "cluster.sh: unknown command $cmd (up, down, ctld-stop, ctld-start)" >&2; exit 2 ;;
esac
