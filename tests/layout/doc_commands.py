#!/usr/bin/env python3
"""Every fsdpx command the docs show exists: Layout.DocCommandsExistInHelp.

Usage: doc_commands.py SOURCE_DIR BIN_DIR [DOC.md ...]

The docs are README.md, docs/**/*.md and sdk/README.md (or the files given). In each fenced code
block, a command is a line (joined with its `\\` continuations; in a block of `$ ` prompts, only the
prompted lines) whose program is `fsdpx-*` or `build/bin/fsdpx-*`, alone or after a launcher
(torchrun, srun, sbatch, an environment assignment, ...). For each one:

  - the program is built: BIN_DIR/fsdpx-* exists and runs;
  - for a program whose usage takes a COMMAND (fsdpx-ckpt, fsdpx-plugins), the subcommand is one
    its --help lists;
  - every --option appears in the program's --help; a component option --KIND.OPTION (fsdpx-train,
    fsdpx-plugins, and the arguments of hosts/slurm/fsdpx.sbatch) is KIND.name or an option that
    `fsdpx-plugins show KIND.NAME` lists for some installed component of that KIND;
  - --KIND.name VALUE and `fsdpx-plugins show VALUE` name an installed component (or `none`, where
    fsdpx-train's --help says that KIND takes it). Upper-case placeholders (NAME, DIR) pass, and so
    do the components of a command that loads plugins of its own (--plugin, --plugin-dir).

Each --help runs once. Exit 0 when every command checks, 1 otherwise, naming file, line and why.
"""
import glob
import os
import re
import shlex
import subprocess
import sys

PROGRAM = re.compile(r"^(?:\./)?(?:build/bin/)?(fsdpx-[a-z0-9-]+)$")
LAUNCHERS = {"torchrun", "srun", "sbatch", "mpirun", "env", "timeout", "time", "nohup",
             "tests/slurm/slurm_cluster.sh", "exec"}
SBATCH_TEMPLATE = "hosts/slurm/fsdpx.sbatch"
COMPONENT_HOSTS = {"fsdpx-train", "fsdpx-plugins"}
OPTION = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9_-]*(?:\.[a-z0-9_]+)?)")
COMPONENT_OPTION = re.compile(r"^--([a-z_]+)\.([a-z0-9_]+)$")


class Host:
    """What the built programs say about themselves, each asked once."""

    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.env = {k: v for k, v in os.environ.items() if k != "FSDPX_PLUGIN_PATH"}
        self.helps = {}
        self._components = None

    def run(self, program, *args, merge=False):
        """(exit status, stdout): stderr too when merge, else only for an error's message."""
        path = os.path.join(self.bin_dir, program)
        proc = subprocess.run([path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=300, env=self.env)
        merge = merge or proc.returncode != 0
        return proc.returncode, proc.stdout + (proc.stderr if merge else "")

    def help(self, program):
        """(text, error): the --help output of a built program, or why there is none."""
        if program not in self.helps:
            path = os.path.join(self.bin_dir, program)
            if not os.access(path, os.X_OK):
                self.helps[program] = (None, f"{program} is not a program in {self.bin_dir}")
            else:
                rc, out = self.run(program, "--help", merge=True)
                error = None if rc == 0 else f"{program} --help exited with {rc}: {out.strip()[:200]}"
                self.helps[program] = (out, error)
        return self.helps[program]

    def options(self, program):
        text, _ = self.help(program)
        return set(OPTION.findall(text or "")) | {"-h"}

    def subcommands(self, program):
        """The COMMANDs of a program whose usage line takes one, else None."""
        text, _ = self.help(program)
        if not text or "COMMAND" not in text.splitlines()[0]:
            return None
        return set(re.findall(r"^  ([a-z][a-z0-9-]*)(?=\s|$)", text, flags=re.M))

    def takes_value(self, program, option):
        text, _ = self.help(program)
        return re.search(re.escape(option) + r"(?: arg\b| [A-Z]|=)", text or "") is not None

    def components(self):
        """{kind: {name: set(options)}} of every installed component."""
        if self._components is None:
            self._components = {}
            rc, out = self.run("fsdpx-plugins", "list")
            if rc != 0:
                raise SystemExit(f"FAIL: fsdpx-plugins list exited with {rc}:\n{out}")
            for line in out.splitlines()[1:]:  # kind, name, version, file
                fields = line.split()
                if len(fields) >= 4:
                    self._components.setdefault(fields[0], {})[fields[1]] = self._show(fields[0], fields[1])
        return self._components

    def _show(self, kind, name):
        rc, out = self.run("fsdpx-plugins", "show", f"{kind}.{name}")
        if rc != 0:
            raise SystemExit(f"FAIL: fsdpx-plugins show {kind}.{name} exited with {rc}:\n{out}")
        options, in_table = set(), False
        for line in out.splitlines():
            if re.match(r"^\s+option\s+type\s+default", line):
                in_table = True
            elif in_table and line.strip():
                options.add(line.split()[0])
            elif in_table:
                break
        return options

    def takes_none(self, kind):
        text, _ = self.help("fsdpx-train")
        return re.search(rf"--{kind}\.name NAME.*\bor none\b", text or "") is not None


def doc_files(source):
    docs = [os.path.join(source, "README.md"), os.path.join(source, "sdk", "README.md")]
    docs += sorted(glob.glob(os.path.join(source, "docs", "**", "*.md"), recursive=True))
    return [d for d in docs if os.path.isfile(d)]


def code_commands(path):
    """(line number, command text) of every command-like line of the fenced blocks of a file."""
    blocks, current, start = [], None, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                if current is None:
                    current, start = [], number
                else:
                    blocks.append((start, current))
                    current = None
            elif current is not None:
                current.append((number, line.rstrip("\n")))
    for _, lines in blocks:
        prompted = any(text.startswith("$ ") for _, text in lines)
        joined, first, pending = [], None, ""
        for number, text in lines:
            if not pending:
                first = number
                if prompted:
                    if not text.startswith("$ "):
                        continue
                    text = text[2:]
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            joined.append((first, pending + text))
            pending = ""
        if pending:
            joined.append((first, pending))
        yield from joined


def words(command):
    command = re.sub(r"\$\([^)]*\)", "VALUE", command)  # a command substitution is one value
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError:
        tokens = command.split("#")[0].split()
    out = []
    for token in tokens:
        token = token.strip("[]")
        if token and token not in ("...", "…"):
            out.append(token)
    return out


def pieces(tokens):
    """The simple commands of a line: split at |, &&, || and ;."""
    piece = []
    for token in tokens:
        if token in ("|", "&&", "||", ";"):
            if piece:
                yield piece
            piece = []
        else:
            piece.append(token)
    if piece:
        yield piece


def find_program(tokens):
    """(program, its arguments) for a command, or None if the line runs no fsdpx program."""
    i = 0
    while i < len(tokens) and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[i]):
        i += 1
    if i == len(tokens):
        return None
    head = tokens[i]
    match = PROGRAM.match(head)
    if match:
        return match.group(1), tokens[i + 1:]
    if head not in LAUNCHERS:
        return None
    for j in range(i + 1, len(tokens)):
        match = PROGRAM.match(tokens[j])
        if match:
            return match.group(1), tokens[j + 1:]
        if tokens[j] == SBATCH_TEMPLATE:  # everything after the script goes to fsdpx-train
            return "fsdpx-train", tokens[j + 1:]
    return None


def placeholder(value):
    return value is None or not re.match(r"^[a-z0-9_.]+$", value)


def check_component_option(host, option, value):
    kind, key = COMPONENT_OPTION.match(option).groups()
    components = host.components()
    if kind not in components:
        return f"{option}: no component kind '{kind}' (kinds: {', '.join(sorted(components))})"
    if key == "name":
        if placeholder(value) or value in components[kind]:
            return None
        if value == "none" and host.takes_none(kind):
            return None
        return f"{option} {value}: no {kind} component '{value}' is installed " \
               f"({', '.join(sorted(components[kind]))})"
    if any(key in options for options in components[kind].values()):
        return None
    return f"{option}: no installed {kind} component has the option '{key}' (fsdpx-plugins show)"


def check_show_argument(host, name):
    if placeholder(name):
        return None
    for kind, named in host.components().items():
        if name in named or name in (f"{kind}.{n}" for n in named):
            return None
    return f"fsdpx-plugins show {name}: no installed component is called '{name}'"


def check(host, program, args):
    """The problems of one command line, as messages."""
    text, error = host.help(program)
    if error:
        return [error]
    problems, known = [], host.options(program)
    commands = host.subcommands(program)
    positional, skip_value = [], False
    # A command that loads plugins of its own (the SDK's example) may name their components.
    own_plugins = any(a.split("=")[0] in ("--plugin", "--plugin-dir") for a in args)
    for k, token in enumerate(args):
        if skip_value:
            skip_value = False
            continue
        if not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        option, _, inline = token.partition("=")
        value = inline or (args[k + 1] if k + 1 < len(args) and not args[k + 1].startswith("--") else None)
        if program in COMPONENT_HOSTS and COMPONENT_OPTION.match(option):
            problem = None if own_plugins else check_component_option(host, option, value)
            skip_value = not inline and value is not None
        elif option in known:
            problem = None
            skip_value = not inline and host.takes_value(program, option)
        else:
            problem = f"{option} is not in `{program} --help`"
        if problem:
            problems.append(problem)
    if commands is not None:
        if not positional:
            problems.append(f"{program} needs a COMMAND ({', '.join(sorted(commands))})")
        elif positional[0] not in commands:
            problems.append(f"'{positional[0]}' is not a command of {program} ({', '.join(sorted(commands))})")
        elif program == "fsdpx-plugins" and positional[0] == "show" and len(positional) > 1 and not own_plugins:
            problem = check_show_argument(host, positional[1])
            if problem:
                problems.append(problem)
    return problems


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    source, bin_dir = argv[1], argv[2]
    docs = argv[3:] or doc_files(source)
    host = Host(bin_dir)
    checked, failures = 0, []
    for doc in docs:
        shown = os.path.relpath(doc, source)
        for number, command in code_commands(doc):
            for piece in pieces(words(command)):
                found = find_program(piece)
                if not found:
                    continue
                checked += 1
                for problem in check(host, *found):
                    failures.append(f"{shown}:{number}: {problem}\n    {command.strip()}")
    if checked == 0:
        print("FAIL: no fsdpx command found in the code blocks of " + ", ".join(docs))
        return 1
    if failures:
        print(f"FAIL: {len(failures)} problem(s) in the {checked} fsdpx commands the docs show:")
        print("\n".join(failures))
        return 1
    print(f"{checked} fsdpx commands in {len(docs)} docs: every program, subcommand and option exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
