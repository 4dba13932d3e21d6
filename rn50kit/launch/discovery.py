"""The host discovery script runner writes for an elastic run given a fixed host list (-H) or a host file
(--hostfile): horovodrun's elastic driver runs it every few seconds and takes its `host:slots` lines as the
hosts available now. With --hostfile the file is read at every call, so adding a line adds a host to the running
job and removing one lets it go. Runs standalone (`python discovery.py --hosts h1:2,h2:2` or `--hostfile FILE`):
no import of the kit, nothing but the standard library."""
import sys


def hostfile_lines(text):
    """`host:slots` lines of an Open MPI/horovodrun host file (`host slots=N`, comments after #)."""
    lines = []
    for line in text.splitlines():
        words = line.split("#")[0].split()
        if words:
            slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")]
            lines.append(f"{words[0]}:{slots[0] if slots else 1}")
    return lines


def host_lines(hosts):
    """`host:slots` lines of -H's `h1:2,h2:2` (a host without slots has 1)."""
    return [entry if ":" in entry else f"{entry}:1" for entry in hosts.split(",") if entry]


def main(argv):
    if len(argv) != 2 or argv[0] not in ("--hosts", "--hostfile"):
        print("usage: discovery.py --hosts h1:2,h2:2 | --hostfile FILE", file=sys.stderr)
        return 2
    if argv[0] == "--hosts":
        lines = host_lines(argv[1])
    else:
        try:
            with open(argv[1]) as f:
                lines = hostfile_lines(f.read())
        except OSError:
            lines = []  # no host available now; the driver waits up to --elastic-timeout for some
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
