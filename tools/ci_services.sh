#!/usr/bin/env bash
# The real services the launcher tests (tests/test_launchers.py) use, on this one machine:
#   - two "hosts", hostA and hostB, in /etc/hosts on loopback addresses (127.0.0.2, 127.0.0.3), served by an sshd
#     that listens on those addresses only, with key-based root login (a key made for this, ~/.ssh/id_rn50_kit)
#     and host-key checking off for these two names only (a marked block at the top of ~/.ssh/config);
#   - munge and a one-node Slurm (this machine, all its cores, partition "debug", PMIx for MPI).
# Run as root (CI does; a developer can too, on a machine where these changes are welcome). Idempotent.
# Usage: tools/ci_services.sh [--install]   (--install: apt-get the packages that are missing first)
set -euo pipefail
PACKAGES=(openmpi-bin libopenmpi-dev openssh-server slurm-wlm munge)
TEST_HOSTS=("127.0.0.2 hostA" "127.0.0.3 hostB")
SSHD_PORT=2222  # its own port (named in the ssh client block), so a system sshd on port 22 is left alone
STATE=/var/lib/rn50-kit  # the sshd and Slurm configuration written here
MARK="# rn50-kit launcher tests"

[ "$(id -u)" = 0 ] || { echo "error: tools/ci_services.sh configures system services: run it as root" >&2; exit 1; }
say() { echo "ci_services: $*"; }

install_packages() {
    local missing=()
    for package in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q "${missing[@]}" </dev/null
    fi
}

add_test_hosts() {
    for entry in "${TEST_HOSTS[@]}"; do
        grep -qE "^${entry%% *}[[:space:]]+${entry##* }\$" /etc/hosts || echo "$entry" >>/etc/hosts
    done
}

ssh_client_config() {  # our key and no host-key prompts, for the test host names only
    mkdir -p -m 700 /root/.ssh
    [ -f /root/.ssh/id_rn50_kit ] || ssh-keygen -q -t ed25519 -N "" -C rn50-kit-tests -f /root/.ssh/id_rn50_kit
    touch /root/.ssh/authorized_keys
    chmod 600 /root/.ssh/authorized_keys
    grep -qF "$(cut -d' ' -f2 /root/.ssh/id_rn50_kit.pub)" /root/.ssh/authorized_keys \
        || cat /root/.ssh/id_rn50_kit.pub >>/root/.ssh/authorized_keys
    local names block rest
    names=$(for entry in "${TEST_HOSTS[@]}"; do printf '%s ' "${entry##* }"; done)
    block="$MARK (begin)
Host ${names% }
    Port $SSHD_PORT
    IdentityFile /root/.ssh/id_rn50_kit
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
$MARK (end)"
    # First match wins in ssh_config: the block goes first, replacing an earlier copy of itself.
    rest=$( [ -f /root/.ssh/config ] && sed "/^$MARK (begin)/,/^$MARK (end)/d" /root/.ssh/config || true)
    printf '%s\n%s\n' "$block" "$rest" >/root/.ssh/config
    chmod 600 /root/.ssh/config
}

start_sshd() {
    mkdir -p "$STATE" /run/sshd
    ssh-keygen -A >/dev/null  # host keys, if the package's set-up made none
    {
        for entry in "${TEST_HOSTS[@]}"; do echo "ListenAddress ${entry%% *}:$SSHD_PORT"; done
        echo "PidFile /run/rn50-kit-sshd.pid"
        echo "PermitRootLogin prohibit-password"
        echo "PasswordAuthentication no"
        echo "KbdInteractiveAuthentication no"
        echo "UsePAM no"
    } >"$STATE/sshd_config"
    /usr/sbin/sshd -t -f "$STATE/sshd_config"
    if ! { [ -f /run/rn50-kit-sshd.pid ] && kill -0 "$(cat /run/rn50-kit-sshd.pid)" 2>/dev/null; }; then
        /usr/sbin/sshd -f "$STATE/sshd_config"
    fi
    for entry in "${TEST_HOSTS[@]}"; do
        ssh -o BatchMode=yes -o ConnectTimeout=10 "${entry##* }" true \
            || { echo "error: ssh to ${entry##* } (${entry%% *}) failed" >&2; exit 1; }
    done
    say "sshd on ${TEST_HOSTS[*]}: ssh works"
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
        sleep 1
    fi
    munge -n </dev/null | unmunge >/dev/null || { echo "error: munge does not work" >&2; exit 1; }
    say "munge works"
}

write_slurm_conf() {
    local node cpus
    if [ -s /etc/slurm/slurm.conf ] && ! grep -q "^$MARK" /etc/slurm/slurm.conf; then
        echo "error: /etc/slurm/slurm.conf exists and is not ours; the Slurm tests need a one-node Slurm" >&2
        exit 1
    fi
    node=$(hostname -s)
    # The node's real layout (CPUs, sockets, cores, threads) as slurmd sees it; RealMemory left at its default
    # so a busy machine does not drain the node.
    cpus=$(slurmd -C | head -n1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
    mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    cat >/etc/slurm/slurm.conf <<EOF
$MARK: one node, this machine (written by tools/ci_services.sh)
ClusterName=rn50kit
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups (containers rarely allow them): processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$node NodeAddr=127.0.0.1 $cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_slurm() {
    write_slurm_conf
    if ! scontrol ping 2>/dev/null | grep -q "is UP"; then
        slurmctld
    fi
    { [ -f /run/slurmd.pid ] && kill -0 "$(cat /run/slurmd.pid)" 2>/dev/null; } || slurmd
    for _ in $(seq 30); do
        sinfo -h -o %t 2>/dev/null | grep -qE "^(idle|mix|alloc)" && break
        sleep 1
    done
    if ! sinfo -h -o %t | grep -qE "^(idle|mix|alloc)"; then
        scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true
        sleep 2
    fi
    srun -n 1 -t 1 true || { sinfo -N -l; echo "error: srun does not run a job; see /var/log/slurm/" >&2; exit 1; }
    say "Slurm: node $(hostname -s) $(sinfo -h -o '%t, %c CPUs'), srun works"
}

[ "${1:-}" = --install ] && install_packages
add_test_hosts
ssh_client_config
start_sshd
start_munge
start_slurm
