"""The docs' command blocks (unit/test_docs_links, e2e/test_docs) and the guides' modules (e2e/test_extending_*)."""
import importlib.util
import os
import sys

from .processes import ROOT

# README.md first, then the pages in the order of the README's guide table: the order the blocks run in (a later
# block may use a run an earlier one made).
DOC_PAGES = ("data", "own-images", "training", "time-to-train", "multi-node", "checkpoints", "benchmarking",
             "scoring", "gpu", "performance", "design")
SHELL_FENCES = ("bash", "sh", "shell", "console")


def doc_files():
    """README.md and docs/*.md in running order (pages not in DOC_PAGES last, so none is missed)."""
    pages = [os.path.join(ROOT, "docs", f"{name}.md") for name in DOC_PAGES]
    others = sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                    if f.endswith(".md") and os.path.join(ROOT, "docs", f) not in pages)
    return [os.path.join(ROOT, "README.md"), *pages, *others]


def doc_blocks(path):
    """Every fenced block of a Markdown file: dicts of file (relative to ROOT), line (of the opening fence),
    lang, marker (the HTML comment on the line before: 'run: demo', 'skip: why'..., or None), text."""
    lines = open(path).read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        opening = lines[i].strip()
        if opening.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            before = lines[i - 1].strip() if i else ""
            marker = before[4:-3].strip() if before.startswith("<!--") and before.endswith("-->") else None
            indent = len(lines[i]) - len(lines[i].lstrip())
            blocks.append({"file": os.path.relpath(path, ROOT), "line": i + 1, "lang": opening[3:].strip(),
                           "marker": marker, "text": "\n".join(line[indent:] for line in lines[i + 1:end])})
            i = end
        i += 1
    return blocks


def section_blocks(path, title, lang="python"):
    """The ``lang`` blocks of the section ``## title`` of a Markdown file, in order, as printed
    (docs/extending.md's guides: e2e/test_extending_*)."""
    text = open(path).read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    start_line, end_line = text.count("\n", 0, start) + 1, (text.count("\n", 0, end) + 1 if end >= 0 else None)
    return [block["text"] for block in doc_blocks(path) if block["lang"] == lang and start_line < block["line"]
            and (end_line is None or block["line"] < end_line)]


def import_guide_module(text, module_name, folder, monkeypatch):
    """A guide's module ``text``, written to ``folder`` (outside the kit's tree) and imported under the name its
    table row gives, ``module_name``, for the test's duration (``monkeypatch``)."""
    path = folder / f"{module_name.rpartition('.')[2]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, module_name, module)
    return module
