"""The network interface a run's workers talk over, chosen or checked before anything starts.

horovodrun's elastic driver (horovod/runner/gloo_run.py, v0.28.1) finds the interfaces the hosts have in common
by probing from host to host, and for that it waits until at least two hosts are available
(_get_min_start_hosts: 2 for an elastic run without --network-interface). A run on one machine never has two, so
it waited --elastic-timeout (600 s) in silence and ended with a TimeoutException. With every host local the
loopback interface is the answer; with one remote host there is nothing to probe and the user must name one; a
named interface must exist here (the driver takes its own address from it: network.get_driver_ip).
"""
import socket
import subprocess

LOOPBACK_ADDRESSES = ("127.0.0.1", "::1")


def interfaces():
    """The names of this machine's network interfaces."""
    return [name for _, name in socket.if_nameindex()]


def loopback_interface():
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux), or None."""
    try:
        import psutil  # a dependency of Horovod's launcher
        for name, addresses in psutil.net_if_addrs().items():
            if any(address.address in LOOPBACK_ADDRESSES for address in addresses):
                return name
    except ImportError:
        pass
    return "lo" if "lo" in interfaces() else None


def is_local(host):
    """Whether ``host`` names this machine (its names, or an address of the loopback)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def missing_interface(names, available=None):
    """One line when an interface of ``names`` (--network-interface's comma-separated list) is not on this
    machine, else None."""
    available = interfaces() if available is None else available
    missing = [name for name in names.split(",") if name.strip() not in available]
    if not missing:
        return None
    return (f"--network-interface {missing[0]}: this machine has no such interface; it has "
            f"{', '.join(available)} (`ip -brief address` shows their addresses)")


def elastic_interface(hosts):
    """The interface an elastic run over ``hosts`` (the host names of -H/--hostfile) uses when none is named:
    the loopback when every host is this machine, None when Horovod can find it (two hosts or more). Raises
    ValueError with one line when it cannot (one remote host)."""
    if all(is_local(host) for host in hosts):
        return loopback_interface()
    if len(set(hosts)) >= 2:
        return None
    raise ValueError(f"an elastic run on one host ({hosts[0]}) needs --network-interface IFACE: horovodrun's "
                     "elastic driver finds a common interface only between two hosts or more (this machine has "
                     f"{', '.join(interfaces())})")


def discovered_hosts(script, timeout_s=30):
    """The hosts a --host-discovery-script reports now (run as horovodrun runs it, through the shell), or none
    when it fails."""
    try:
        out = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip().partition(":")[0] for line in out.splitlines() if line.strip()]
