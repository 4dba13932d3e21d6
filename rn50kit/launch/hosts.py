"""The hosts of a multi-node run (-H or --hostfile), their slots, and how many workers share this machine."""
from rn50kit.config.cli import UsageError
from rn50kit.launch import discovery


def host_slots(args):
    """Slots per host of -H or --hostfile, or None for a single-node run."""
    if args.hosts:
        slots = []
        for entry in args.hosts.split(","):
            host, _, count = entry.partition(":")
            if not host or (count and not count.isdigit()):
                raise UsageError(f"-H {args.hosts}: expected host:slots entries, e.g. host1:8,host2:8")
            slots.append(int(count or 1))
        return slots
    if args.hostfile:
        if not args.hostfile.is_file():
            raise UsageError(f"--hostfile {args.hostfile} does not exist")
        slots = []
        for line in args.hostfile.read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                count = [w.split("=")[1] for w in line.split()[1:] if w.startswith("slots=")]
                slots.append(int(count[0]) if count and count[0].isdigit() else 1)
        return slots
    return None


def host_names(args):
    """The hosts of -H or --hostfile (a missing file is host_slots' to refuse), or None for a single-node run."""
    if args.hostfile:
        text = args.hostfile.read_text() if args.hostfile.is_file() else ""
        return [line.partition(":")[0] for line in discovery.hostfile_lines(text)]
    return [entry.partition(":")[0] for entry in args.hosts.split(",")] if args.hosts else None


def workers_per_node(args, environ, launcher):
    """How many workers share one machine's cores: those of the host list's largest host, else as many as
    ``launcher`` (launchers.Launcher) starts here."""
    slots = host_slots(args)
    if slots:
        return max(1, min(args.ngpus, max(slots)))
    return launcher.workers_on_this_node(args, environ)
