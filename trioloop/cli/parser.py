"""The `trioloop` command line: one function per subcommand, wired up by `_build_parser`.

Building the parser imports nothing but argparse: each command imports what it needs when it runs, so
``trioloop --help`` and ``trioloop --version`` cost only the interpreter's start.

The exit codes live in `exit_codes`, below the parser, so the subcommands it dispatches to share them without
importing the parser back.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from trioloop.cli.exit_codes import EXIT_BROKEN_PIPE, EXIT_INVALID, EXIT_OK, EXIT_USAGE

__all__ = ["main"]

Command = Callable[[argparse.Namespace], int]


def _cmd_validate(args: argparse.Namespace) -> int:
    """Check a `.thf` file and print its version and section counts."""
    from trioloop.threatmodel.errors import ThfError
    from trioloop.threatmodel.model import SECTION_NAMES
    from trioloop.threatmodel.thf import load_thf

    path = Path(args.file)
    try:
        model = load_thf(path)
    except ThfError as error:
        print(f"error: {type(error).__name__}: {error.message}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as error:
        reason = error.strerror or type(error).__name__
        print(f"error: cannot read {args.file}: {reason}", file=sys.stderr)
        return EXIT_USAGE
    counts = ", ".join(f"{len(model.section(name))} {name}" for name in SECTION_NAMES)
    print(f"{args.file}: valid .thf {model.version} ({counts})")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    """Play the scripted review session against a document (default: examples/payment.thf)."""
    from trioloop.cli.demo import run_demo

    return run_demo(args.file, args.approve, args.out, args.undo, show_limit=args.show_limit)


def _cmd_chat(args: argparse.Namespace) -> int:
    """The same loop against a real provider API, key from the environment."""
    if args.resume is not None and not Path(args.resume).is_file():  # checked first: nothing is made, nothing asked
        print(f"error: nothing to resume at {args.resume}", file=sys.stderr)
        return EXIT_USAGE
    from trioloop.cli.chat import run_chat
    from trioloop.durable.signing import JournalKeyError, given_public_keys

    try:
        keys = given_public_keys(args.public_key, args.public_keys)
    except JournalKeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    journal, session_file = _journal_path(args)
    return run_chat(
        args.file,
        args.provider,
        args.model,
        args.approve,
        mcp=args.mcp,
        mcp_config=args.mcp_config,
        out=args.out,
        base_url=args.base_url,
        thinking_budget=args.thinking_budget,
        journal=journal,
        resume=args.resume is not None and session_file is None,
        session_file=session_file,
        timeout=args.timeout,
        one_shot=args.prompt,
        mcp_env=args.mcp_env,
        keys=keys,
    )


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _journal_path(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The chat's journal and the session file it continues, if any. ``--resume`` names either a journal (a
    SQLite file: its latest chat goes on in it) or a session file `/save` wrote (it goes on in --session's
    journal, default FILE.journal); no journal with --no-session."""
    resumed = args.resume
    if resumed is not None:
        try:
            with open(resumed, "rb") as file:
                magic = file.read(len(_SQLITE_MAGIC))
        except OSError:
            magic = _SQLITE_MAGIC  # let the journal path report it
        if magic == _SQLITE_MAGIC:
            return str(resumed), None
    journal = None if args.no_session else (str(args.session) if args.session else f"{args.file}.journal")
    return journal, resumed


def _cmd_audit(args: argparse.Namespace) -> int:
    """Print a journaled session's audit trail and verify its hash chain."""
    from trioloop.cli.audit import run_audit

    return run_audit(
        args.target, args.session, as_json=args.json, public_keys=args.public_key, key_files=args.public_keys
    )


#: The web extra's commands (`_cmd_web`), and what ``trioloop --help`` says of them.
_WEB_COMMANDS = {
    "serve": "serve the review inbox over a journal store: reviewers decide in the browser (see serve --help)",
    "worker": "carry a store's decided sessions on: take them up, run what was approved, suspend at the next review",
}


def _cmd_web(command: str, argv: Sequence[str]) -> int:
    """``trioloop serve`` / ``trioloop worker``: the web extra's commands, which parse their own options (so the
    other commands never load Starlette or Hypercorn)."""
    try:
        if command == "serve":
            from trioloop.web.serve import add_serve_arguments as add_arguments
            from trioloop.web.serve import serve_main as run
        else:
            from trioloop.web.worker import add_worker_arguments as add_arguments
            from trioloop.web.worker import worker_main as run
    except ImportError as exc:
        print(f'error: trioloop {command} needs the web extra: pip install "trioloop[web]" ({exc})', file=sys.stderr)
        return EXIT_USAGE
    parser = argparse.ArgumentParser(prog=f"trioloop {command}", description=_WEB_COMMANDS[command])
    add_arguments(parser)
    try:
        options = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    return run(options)


def _cmd_rules(args: argparse.Namespace) -> int:
    """Show, check, trust or untrust approval rule files."""
    from trioloop.cli import rules

    if args.action == "show":
        return rules.rules_show(args.document)
    run = {"check": rules.rules_check, "trust": rules.rules_trust, "untrust": rules.rules_untrust}[args.action]
    return run(args.path)


def _cmd_key(args: argparse.Namespace) -> int:
    """Print the id and public key of the key that signs this user's journals (made on first use)."""
    from trioloop.durable.signing import KEY_ENV, JournalKeyError, JournalSigner, default_key_path

    try:
        signer = JournalSigner.default()
    except JournalKeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{signer.key_id} {signer.public_key_text}")
    if args.path:
        import os

        print(os.environ.get(KEY_ENV) or default_key_path())
    return EXIT_OK


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("trioloop")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked for (the package metadata costs)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        sys.stdout.write(f"trioloop {_version()}\n")
        parser.exit()


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trioloop",
        description="A bounded, cancellable, reviewable AI tool loop over a threat model.",
        epilog="exit codes: 0 ok, 1 invalid document, 2 usage or configuration error, 3 a chat turn failed, "
        "4 the input ended at a review card, 130 interrupted, 141 output closed",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    validate = commands.add_parser("validate", help="check a .thf threat model file")
    validate.add_argument("file", metavar="FILE", help="path to the .thf file")
    validate.set_defaults(run=_cmd_validate)

    demo = commands.add_parser("demo", help="run the scripted review demo (no network, no key)")
    demo.add_argument("file", metavar="FILE", nargs="?", help="a .thf file (default: examples/payment.thf)")
    demo.add_argument(
        "--approve",
        choices=("ask", "safe", "none"),
        default="ask",
        help="ask at each card (default); approve every non-destructive call and deny the rest; deny all",
    )
    demo.add_argument("--out", metavar="FILE", help="write the resulting document here")
    demo.add_argument("--undo", action="store_true", help="undo the turn at the end and show the document restored")
    demo.add_argument(
        "--show-limit",
        action="store_true",
        help="give the turn one model request fewer than the script needs, to show a turn ending at its step limit",
    )
    demo.set_defaults(run=_cmd_demo)

    chat = commands.add_parser("chat", help="edit a .thf file with a real model (needs an API key)")
    chat.add_argument("file", metavar="FILE", help="the .thf file to edit")
    chat.add_argument(
        "--provider",
        choices=("anthropic", "openai", "openai-responses"),
        required=True,
        help="the API to speak: anthropic (Messages API), openai (Chat Completions, also any "
        "OpenAI-compatible server: Ollama, vLLM, llama.cpp, LiteLLM, Azure, Gemini) or openai-responses "
        "(the Responses API, stateless: OpenAI, Azure, OpenRouter, Ollama, LM Studio, vLLM)",
    )
    chat.add_argument(
        "--model",
        help="model id (default: claude-sonnet-4-5 for anthropic, gpt-4.1 for openai, gpt-5 for "
        "openai-responses); a model trioloop does not know is used with a warning",
    )
    chat.add_argument(
        "--base-url",
        metavar="URL",
        help="the API's base URL, e.g. http://localhost:11434/v1 for Ollama (default: $ANTHROPIC_BASE_URL / "
        "$OPENAI_BASE_URL, else the provider's own); https, or http to this machine only",
    )
    chat.add_argument(
        "--thinking-budget",
        metavar="TOKENS",
        type=_positive_int,
        help="anthropic only: turn on extended thinking with this many budget tokens (at least 1024)",
    )
    chat.add_argument(
        "--approve",
        choices=("ask", "safe", "none"),
        default="ask",
        help="ask at each card (default); approve every non-destructive call and deny the rest; deny all",
    )
    chat.add_argument(
        "--mcp",
        metavar='"[NAME=]COMMAND ARGS"',
        action="append",
        default=[],
        help="also offer the tools of this MCP server (stdio), named after the server (npx -y "
        "@modelcontextprotocol/server-memory gives memory__*; NAME=COMMAND names it); repeatable. The server gets "
        "the environment you exported (--mcp-env narrows it). Every such tool needs its own approval",
    )
    chat.add_argument(
        "--mcp-env",
        metavar="VAR",
        action="append",
        help="give --mcp servers only this variable of your environment (repeatable), beside PATH, HOME and the like",
    )
    chat.add_argument(
        "--mcp-config",
        metavar="FILE",
        help="a TOML file of [servers.NAME] (command/args, or url with optional headers whose ${VAR} come from "
        "your environment, or oauth = true to sign in in your browser; sampling = true lets a server ask for the "
        "model, each request a card) and [servers.NAME.tools] name = read|mutate",
    )
    chat.add_argument(
        "--out", metavar="FILE", help="save the document here (default: in place, after every turn that changed it)"
    )
    chat.add_argument(
        "--session",
        metavar="JOURNAL",
        help="journal every turn in this SQLite file (default: FILE.journal), so a killed terminal can resume",
    )
    chat.add_argument(
        "--resume",
        metavar="JOURNAL|FILE",
        help="continue the latest chat journaled in JOURNAL (its conversation, document and any review left open), "
        "or a session file /save wrote",
    )
    chat.add_argument("--no-session", action="store_true", help="keep no journal (nothing to resume after a crash)")
    chat.add_argument(
        "--public-key",
        metavar="KEY",
        action="append",
        default=[],
        help="with --resume: a public key that also verifies the journal (a key since rotated; as `trioloop key` "
        "prints it; repeatable)",
    )
    chat.add_argument(
        "--public-keys",
        metavar="FILE",
        action="append",
        default=[],
        help="with --resume: a file of such public keys, one per line (repeatable)",
    )
    chat.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        help="the turn deadline (default 300): a turn still running then stops, keeping what it committed",
    )
    chat.add_argument(
        "--prompt",
        metavar="TEXT",
        help="one-shot: run this one request and exit (status 3 if the turn failed or ended at a limit, 4 if the "
        "input ended at a review card)",
    )
    chat.set_defaults(run=_cmd_chat)

    audit = commands.add_parser(
        "audit",
        help="print a journaled session's audit trail and verify it (exit 1 if it does not, 5 if no public key was "
        "there to verify it with)",
    )
    audit.add_argument(
        "target", metavar="FILE|URL", help="the journal store: a SQLite file (sqlite:///PATH) or a postgresql:// URL"
    )
    audit.add_argument("--session", metavar="ID", help="the session to audit (default: every session in the store)")
    audit.add_argument(
        "--json", action="store_true", help="print JSON lines: each session's verdict, then its verified entries"
    )
    audit.add_argument(
        "--public-key",
        metavar="KEY",
        action="append",
        default=[],
        help="a public key that checks the journal's signatures (as `trioloop key` prints it; repeatable); "
        "your own signing key's is used too when it exists",
    )
    audit.add_argument(
        "--public-keys",
        metavar="FILE",
        action="append",
        default=[],
        help="a file of public keys, one per line as `trioloop key` prints them (old keys after a rotation, say; "
        "repeatable)",
    )
    audit.set_defaults(run=_cmd_audit)

    rules = commands.add_parser(
        "rules",
        help="show the approval rules a document's files give, check a rule file, trust or untrust a project's",
    )
    actions = rules.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", help="the rules in effect from the user's and the project's rule files, and those not in effect"
    )
    show.add_argument(
        "document", metavar="DOCUMENT", nargs="?", help="the document (default: the current folder's project)"
    )
    for action, text in (
        ("check", "parse a rule file and report its errors with file:line (exit 1 if it has any)"),
        ("trust", "trust a project rule file's exact content: its allow rules take effect until it changes"),
        ("untrust", "stop trusting a project rule file: its allow rules no longer take effect"),
    ):
        actions.add_parser(action, help=text).add_argument("path", metavar="PATH", help="the rule file")
    rules.set_defaults(run=_cmd_rules)

    key = commands.add_parser(
        "key",
        help="print the id and public key of the key that signs your journals (made on first use); "
        "an auditor checks a journal with the public key alone",
    )
    key.add_argument("--path", action="store_true", help="also print where the private key is kept")
    key.set_defaults(run=_cmd_key)

    for name, text in _WEB_COMMANDS.items():  # listed here; `_run` hands their arguments to them whole
        commands.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); returns the exit code.

    A closed output (``trioloop audit J | head -1``) ends any command quietly with `EXIT_BROKEN_PIPE`, never a
    traceback: the error may come bare or inside the exception groups of Trio's nurseries."""
    try:
        code = _run(argv)
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's own flush at exit
    except BaseException as exc:
        if not _only_broken_pipes(exc):
            raise
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    return code


def _run(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in _WEB_COMMANDS:
        return _cmd_web(given[0], given[1:])
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits 2 on usage errors and 0 after --help; report that as our return value.
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    command: Command = args.run
    return command(args)


def _only_broken_pipes(exc: BaseException) -> bool:
    """Whether ``exc`` is a `BrokenPipeError`, or a group (nested or not) holding nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_broken_pipes(inner) for inner in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _stdout_to_devnull() -> None:
    """Point the standard output at the null device, so the interpreter's flush at exit finds nothing to fail on
    (what the Python docs advise for SIGPIPE)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing is flushed to a pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)
