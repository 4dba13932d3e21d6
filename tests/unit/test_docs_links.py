"""The guide's fast checks: every fenced shell block of README.md and docs/*.md says whether the slow lane runs it
(`<!-- run: demo -->`, `<!-- run: dry-run -->`) or why not (`<!-- skip: why -->`), and every relative link and
#anchor resolves by GitHub's rule."""
import os
import re

import pytest

from support.docs import SHELL_FENCES, doc_blocks, doc_files
from support.processes import ROOT

MARKERS = re.compile(r"(run: (demo|dry-run)|skip: \S.*)$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading):
    """GitHub's anchor for a heading: lowercase, punctuation other than - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(path):
    """The file's lines outside fenced blocks (links and headings in code are not links or headings)."""
    out, fenced = [], False
    for number, line in enumerate(open(path).read().split("\n"), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def anchors(path):
    found = {}
    for _, line in prose(path):
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = github_anchor(match.group(1))
            found[base] = found.get(base, -1) + 1
    return {name if count == 0 else f"{name}-{i}" for name, count in found.items() for i in range(count + 1)} | \
        set(found)


def test_github_anchor_rule():
    assert github_anchor("Multi-node: SSH, MPI and Slurm") == "multi-node-ssh-mpi-and-slurm"
    assert github_anchor("2. Get ImageNet weights") == "2-get-imagenet-weights"
    assert github_anchor("The `mlperf_log` file") == "the-mlperf_log-file"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shell_block_is_marked(path):
    wanted = "<!-- run: demo|dry-run --> or <!-- skip: why -->"
    unmarked = [f"{b['file']}:{b['line']}: ```{b['lang']} block without {wanted}" for b in doc_blocks(path)
                if b["lang"] in SHELL_FENCES and not MARKERS.match(b["marker"] or "")]
    assert not unmarked, "\n".join(unmarked)


def test_no_unlabelled_fence_holds_a_command():
    """A command in a fence without a language would escape the marking rule."""
    found = [f"{b['file']}:{b['line']}" for path in doc_files() for b in doc_blocks(path)
             if not b["lang"] and re.search(r"^(\./|python|examples/|tools/|make )", b["text"], re.M)]
    assert not found, f"give these fences a language (bash): {found}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for number, line in prose(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, ROOT)}:{number}: {target}"
            if not os.path.exists(resolved):
                broken.append(f"{where} (no file {os.path.relpath(resolved, ROOT)})")
            elif anchor and (not resolved.endswith(".md") or anchor not in anchors(resolved)):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "\n".join(broken)
