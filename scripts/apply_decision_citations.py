#!/usr/bin/env python3
"""Replaces the diary citations in source comments (docs/PERF.md sessions and runs) by the
docs/DECISIONS.md IDs that docs/decision_citations.tsv maps them to, in every tracked source file.

    python3 scripts/apply_decision_citations.py [--dry-run] [--tsv docs/decision_citations.tsv]

Plain string replacement, longest citation first. A citation may be broken over comment lines
in the source: a space in the TSV's text also matches a line break with the next line's comment
leader (//, # or *). A citation is not matched as the start of a longer one ("session 3" does
not match "session 3 run 5" or "session 31"). Where a replaced citation spanned lines, the rest
of the next line joins the replacement's line, and a comment line made longer than 100 columns
that way is wrapped at a space (same indent and comment leader). Prints each change (file:line, before -> after)
and, at the end, the citations that matched nothing and the diary citations left in the tree.
"""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cu", ".cpp", ".cc", ".c", ".py", ".sh", ".cmake", ".txt", ".in"}
# What may stand between two words of a citation: spaces, or a line break and a comment leader.
SEPARATOR = r"(?:[ \t]*\n[ \t]*(?://+|#+|\*)?[ \t]*|[ \t]+)"
# What may not follow a citation: more of a word or number, or a run number that makes it longer.
NOT_LONGER = r"(?![\w'])(?!,?" + SEPARATOR + r"runs?\b)"
LEFT_OVER = re.compile(r"PERF\.md|TEAM\.md|\bsessions? \d")
WRAP_COLUMNS = 100
COMMENT_LINE = re.compile(r"^([ \t]*(?://+|#+|\*)[ \t]?)")


def wrap_new_long_lines(text, original):
    """Comment lines that the replacements made (not in original) and that exceed WRAP_COLUMNS,
    wrapped at a space. The words past the limit move to the start of the next line when it
    continues the same comment, once; else (or if that line then overflows) onto a line of
    their own."""
    before = set(original.splitlines())
    lines = text.split("\n")
    flowed = set()  # indices of lines that received words from the line above
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        leader = COMMENT_LINE.match(line)
        if not leader or line in before or len(line) <= WRAP_COLUMNS:
            out.append(line)
            i += 1
            continue
        start = len(leader.group(1))
        cut = line.rfind(" ", start + 1, WRAP_COLUMNS + 1)
        while cut > 0 and line.startswith("D-", cut + 1):  # keep "docs/DECISIONS.md D-n" whole
            cut = line.rfind(" ", start + 1, cut)
        if cut <= start:
            out.append(line)
            i += 1
            continue
        out.append(line[:cut].rstrip())
        rest = line[cut + 1:]
        following = lines[i + 1] if i + 1 < len(lines) else None
        next_leader = COMMENT_LINE.match(following) if following is not None else None
        if (i not in flowed and next_leader and next_leader.group(1) == leader.group(1)
                and following[start:].strip()):
            lines[i + 1] = leader.group(1) + rest + " " + following[start:]
            flowed.add(i + 1)
        else:
            lines.insert(i + 1, leader.group(1) + rest)
            flowed = {j + 1 if j > i else j for j in flowed}
        i += 1
    return "\n".join(out)


def read_mapping(tsv):
    mapping = []
    for number, line in enumerate(tsv.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0] or not fields[1]:
            sys.exit(f"{tsv}:{number}: want 'citation<TAB>replacement', got {line!r}")
        mapping.append((fields[0], fields[1]))
    return sorted(mapping, key=lambda pair: len(pair[0]), reverse=True)


def pattern_of(citation):
    words = [re.escape(word) for word in citation.split(" ")]
    return re.compile(r"(?<![\w/])" + SEPARATOR.join(words) + NOT_LONGER + r"(?P<tail>[;:,.)\]]*)")


def replacer(replacement):
    """The text for a match: the replacement and the punctuation that followed the citation. A
    citation that spanned lines keeps a line break after them (where the next line goes on)."""
    def replace(match):
        text = replacement + match.group("tail")
        broken = re.search(r"\n[ \t]*(?://+|#+|\*)?[ \t]*", match.group(0))
        rest = match.string[match.end():]
        if broken and rest and not rest.startswith("\n"):
            text += broken.group(0).rstrip()  # the rest of the line brings its own space
        return text
    return replace


def tracked_sources():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for name in listed.splitlines():
        path = ROOT / name
        if name.startswith("docs/") or path.name == "apply_decision_citations.py":
            continue  # the docs and this script name the citations on purpose
        if path.suffix in SOURCE_SUFFIXES or path.name == "CMakeLists.txt":
            yield path


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tsv", type=pathlib.Path, default=ROOT / "docs" / "decision_citations.tsv")
    ap.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = ap.parse_args()
    mapping = [(citation, replacement, pattern_of(citation)) for citation, replacement in read_mapping(args.tsv)]
    used = {citation: 0 for citation, _, _ in mapping}
    changed_files = 0
    for path in tracked_sources():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        original = text
        for citation, replacement, pattern in mapping:
            for match in pattern.finditer(text):
                used[citation] += 1
                where = f"{path.relative_to(ROOT)}:{line_of(text, match.start())}"
                print(f"{where}: {match.group(0)!r} -> {replacement!r}")
            text = pattern.sub(replacer(replacement), text)
        if text != original:
            text = wrap_new_long_lines(text, original)
            changed_files += 1
            if not args.dry_run:
                path.write_text(text)
    print(f"{sum(used.values())} replacements in {changed_files} files{' (dry run)' if args.dry_run else ''}")
    for citation, count in used.items():
        if count == 0:
            print(f"matched nothing: {citation!r}")
    if not args.dry_run:
        for path in tracked_sources():
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if LEFT_OVER.search(line):
                    print(f"left: {path.relative_to(ROOT)}:{number}: {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
