#!/usr/bin/python3
"""Every command the docs show is checked against the program it names.

README.md and docs/**/*.md: each fenced ```sh block must pass `bash -n`; in every ```sh and ```text
block, each command that runs one of dt's binaries may only use flags that binary's --help lists
(dtctl's per subcommand; the words after `dtctl submit ... --` against dttrainer's, unless --exec;
a program after dtrun's `--` is the user's), and a command that runs a script of the tree
(scripts/..., deploy/..., tests/..., examples/...) names a file that exists and is executable.

  docs_check.py SOURCE_DIR BINARY_DIR
"""
import glob
import os
import re
import shlex
import subprocess
import sys

BINARIES = {"dtctl", "dtcoord", "dtrun", "dttrainer", "dtslot"}
# dtctl's global options that take a value (they may come before the subcommand).
DTCTL_GLOBAL_VALUES = {"--coordinator", "--token-file", "--tls-ca", "-o", "--output"}
SEPARATORS = {"&&", "||", "|", ";", "&"}
PREFIXES = {"sudo", "env", "exec", "nohup", "time"}
TREE_DIRS = ("scripts/", "deploy/", "tests/", "examples/", "bench/")


def fenced_blocks(path):
    """(language, first line number, text) of each fenced block."""
    lang, start, lines = None, 0, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                if lang is None:
                    lang, start, lines = line[3:].strip(), number + 1, []
                else:
                    yield lang, start, "".join(lines)
                    lang = None
            elif lang is not None:
                lines.append(line)


def logical_lines(text):
    """Lines with backslash continuations joined, with the number of the first."""
    out, current, first = [], "", 0
    for number, line in enumerate(text.split("\n")):
        if not current:
            first = number
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            out.append((first, current))
        current = ""
    return out


def simple_commands(line):
    """The simple commands of a line, as word lists (a `VAR=$(...)` assignment's command too)."""
    line = re.sub(r"^\s*\w+=\$\((.*)\)\s*$", r"\1", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    commands, current = [], []
    for w in words:
        if w in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(w)
    commands.append(current)
    return [c for c in commands if c]


def program_of(words):
    """(index of the program word, its words) after assignments and prefixes like sudo."""
    i = 0
    while i < len(words) and (re.match(r"^\w+=", words[i]) or words[i] in PREFIXES):
        i += 1
    return i


class Helps:
    def __init__(self, binary_dir):
        self.binary_dir = binary_dir
        self.cache = {}

    def text(self, binary, sub):
        key = (binary, sub)
        if key not in self.cache:
            argv = [os.path.join(self.binary_dir, binary)] + ([sub] if sub else []) + ["--help"]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            self.cache[key] = (r.returncode, r.stdout + r.stderr)
        return self.cache[key]


def flags_before_separator(words):
    flags, rest = [], []
    for i, w in enumerate(words):
        if w == "--":
            return flags, words[i + 1:]
        if w.startswith("-") and w not in ("-", "--") and not re.match(r"^-\d", w):
            flags.append(w.split("=", 1)[0])
    return flags, rest


def listed(flag, help_text):
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", help_text) is not None


def check_binary_command(words, helps):
    """Problems with a command running one of dt's binaries."""
    binary = os.path.basename(words[0])
    args = words[1:]
    sub = ""
    if binary in ("dtctl", "dttrainer"):
        i = 0
        while i < len(args):
            if args[i] in DTCTL_GLOBAL_VALUES:
                i += 2
            elif args[i].startswith("-"):
                i += 1
            else:
                sub = args[i]
                break
        if binary == "dttrainer" and sub and not re.match(r"^[a-z-]+$", sub):
            sub = ""
        if sub and binary == "dttrainer":
            code, _ = helps.text(binary, sub)
            if code != 0:
                sub = ""  # a positional argument, not a subcommand
    code, help_text = helps.text(binary, sub)
    where = f"{binary} {sub}".strip()
    if code != 0:
        return [f"`{where} --help` failed ({code}): it is not a command of {binary}"]
    if binary == "dtctl" and sub:
        code_global, global_help = helps.text(binary, "")
        help_text += global_help
    flags, after = flags_before_separator(args)
    problems = [f"{flag} is not an option of `{where}`" for flag in flags if flag != sub and not listed(flag, help_text)]
    if binary == "dtctl" and sub == "submit" and "--exec" not in flags and after:
        trainer_code, trainer_help = helps.text("dttrainer", "")
        trainer_flags = [w.split("=", 1)[0] for w in after if w.startswith("--")]
        problems += [f"{flag} (after --) is not an option of dttrainer" for flag in trainer_flags
                     if not listed(flag, trainer_help)]
    return problems


def main():
    source_dir, binary_dir = sys.argv[1], sys.argv[2]
    docs = [os.path.join(source_dir, "README.md")] + sorted(
        glob.glob(os.path.join(source_dir, "docs", "**", "*.md"), recursive=True))
    helps = Helps(binary_dir)
    problems, checked = [], 0
    for path in docs:
        shown = os.path.relpath(path, source_dir)
        for lang, start, text in fenced_blocks(path):
            if lang not in ("sh", "text"):
                continue
            if lang == "sh":
                r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
                if r.returncode != 0:
                    problems.append(f"{shown}:{start}: not valid shell: {r.stderr.strip()}")
            for offset, line in logical_lines(text):
                for words in simple_commands(line):
                    i = program_of(words)
                    if i >= len(words) or "[...]" in words:
                        continue
                    program = words[i]
                    found = []
                    if os.path.basename(program) in BINARIES:
                        found = check_binary_command(words[i:], helps)
                        checked += 1
                    elif program.startswith(TREE_DIRS):
                        target = os.path.join(source_dir, program)
                        if not (os.path.isfile(target) and os.access(target, os.X_OK)):
                            found = [f"{program} is not an executable file of the tree"]
                        checked += 1
                    problems += [f"{shown}:{start + offset}: {p}\n    {line.strip()}" for p in found]
    for p in problems:
        print(p)
    print(f"{checked} commands checked in {len(docs)} files; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
