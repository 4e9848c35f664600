"""``trioloop serve``: the review inbox on Hypercorn's Trio worker, from the command line.

`add_serve_arguments` adds the command's options to a parser and `serve_main` runs it (the CLI wires both; ``python
-m trioloop.web.serve`` runs them alone). It opens the store, loads the reviewers file and the server's signing key
(made on first use), prints that key's public half (the app must accept it, or no decision it posts will apply) and
a one-time login link per reviewer, and serves until Ctrl-C. It listens on 127.0.0.1 by default, and refuses another
address without TLS (``--certfile``/``--keyfile``) unless ``--insecure-http`` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from trioloop.durable.files import config_folder
from trioloop.durable.signing import JournalKeyError, JournalKeys, JournalSigner, given_public_keys
from trioloop.durable.store import JournalStoreError
from trioloop.stores import open_store
from trioloop.web._heap import freeze_startup_heap
from trioloop.web.app import InboxSettings, open_inbox
from trioloop.web.reviewers import ReviewerError, load_reviewers

__all__ = ["DEFAULT_PORT", "add_serve_arguments", "default_inbox_key_path", "run_serve", "serve_main"]

DEFAULT_PORT = 8470


def default_inbox_key_path() -> Path:
    """``$XDG_CONFIG_HOME/trioloop/inbox-key``: the key the inbox signs decisions with, made on first use."""
    return config_folder() / "inbox-key"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``trioloop serve``."""
    parser.add_argument(
        "store", metavar="STORE", help="the journal store: a SQLite file, sqlite:///PATH or postgresql://"
    )
    parser.add_argument(
        "--reviewers",
        metavar="FILE",
        required=True,
        help="the reviewers file (TOML: [[reviewer]] id, name, token_sha256)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default: {DEFAULT_PORT})")
    parser.add_argument(
        "--signing-key",
        metavar="PATH",
        help="the inbox's signing key (default: $XDG_CONFIG_HOME/trioloop/inbox-key, made once)",
    )
    parser.add_argument(
        "--keys",
        metavar="FILE",
        action="append",
        default=[],
        help="a file of public keys that verify the journals (one per line, as `trioloop key` prints; repeatable); "
        "default: the per-user journal key's public key",
    )
    parser.add_argument(
        "--public-key", metavar="KEY", action="append", default=[], help="a public key that verifies the journals"
    )
    parser.add_argument(
        "--login-link",
        metavar="ID",
        action="append",
        default=[],
        help="print a one-time login link for this reviewer at start (repeatable; default: one for each reviewer)",
    )
    parser.add_argument("--certfile", metavar="PATH", help="serve HTTPS with this certificate (cookies become Secure)")
    parser.add_argument("--keyfile", metavar="PATH", help="the certificate's private key")
    parser.add_argument(
        "--origin",
        metavar="URL",
        action="append",
        default=[],
        help="the server's public origin when it is reached under another name (https://inbox.example.com; repeatable)",
    )
    parser.add_argument(
        "--insecure-http", action="store_true", help="allow plain HTTP on an address other than loopback (not advised)"
    )
    parser.add_argument("--idle-minutes", type=float, default=480.0, help="a login ends after this idle time")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _origins(host: str, port: int, tls: bool, extra: Sequence[str]) -> frozenset[str]:
    scheme = "https" if tls else "http"
    names = {host, f"[{host}]" if ":" in host and not host.startswith("[") else host}
    if _loopback(host):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    found = {f"{scheme}://{name}:{port}" for name in names}
    if (tls and port == 443) or (not tls and port == 80):
        found |= {f"{scheme}://{name}" for name in names}
    return frozenset(found | {origin.rstrip("/") for origin in extra})


def _signer(path: str | None) -> JournalSigner:
    key_path = Path(path) if path else default_inbox_key_path()
    if not key_path.exists():
        with contextlib.suppress(FileExistsError):  # another server made it first
            JournalSigner.generate().save(key_path)
    return JournalSigner.load(key_path)


def _journal_keys(args: argparse.Namespace) -> JournalKeys:
    given = given_public_keys(args.public_key, args.keys)
    if given:
        return given
    own = JournalSigner.existing()
    if own is None:
        raise JournalKeyError(
            "no public key to verify the journals with: pass --keys FILE or --public-key KEY (the app's journal key, "
            "as `trioloop key` prints it)"
        )
    return own.keys


async def run_serve(args: argparse.Namespace, *, out: TextIO | None = None, task_status: Any = None) -> int:
    """Serve the inbox as ``args`` say until cancelled (Ctrl-C) or SIGTERM; the exit status."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    out = out or sys.stdout
    tls = bool(args.certfile)
    if tls != bool(args.keyfile):
        print("trioloop serve: --certfile and --keyfile go together", file=sys.stderr)
        return 2
    if not _loopback(args.host) and not tls and not args.insecure_http:
        print(
            f"trioloop serve: refusing to serve {args.host} over plain HTTP: give --certfile and --keyfile, or "
            "--insecure-http if a proxy in front of it adds TLS",
            file=sys.stderr,
        )
        return 2
    try:
        reviewers = load_reviewers(args.reviewers)
        signer = _signer(args.signing_key)
        keys = _journal_keys(args)
    except (ReviewerError, JournalKeyError, OSError) as exc:
        print(f"trioloop serve: {exc}", file=sys.stderr)
        return 2
    settings = InboxSettings(
        reviewers=reviewers,
        signer=signer,
        origins=_origins(args.host, args.port, tls, args.origin),
        secure_cookies=tls,
        idle_s=args.idle_minutes * 60,
    )
    config = Config()
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    config.bind = [f"{host}:{args.port}"]
    config.accesslog = None
    config.graceful_timeout = 2.0
    if tls:
        config.certfile, config.keyfile = args.certfile, args.keyfile
    base = f"{'https' if tls else 'http'}://{'127.0.0.1' if _loopback(args.host) else host}:{args.port}"
    if args.origin:
        base = args.origin[0].rstrip("/")
    try:
        store_cm = open_store(args.store)
        async with store_cm as store, open_inbox(store, keys, settings) as app:
            print(f"trioloop inbox on {base}/ (journals in {args.store})", file=out)
            print(f"decisions are signed with the inbox key {signer.key_id} {signer.public_key_text}", file=out)
            print("the app must accept this key (keys= / --keys) or no decision posted here will apply", file=out)
            for reviewer_id in args.login_link or [r.id for r in reviewers]:
                token = app.links.issue(reviewer_id)
                print(f"one-time login for {reviewer_id} (15 minutes): {base}/login/link/{token}", file=out)
            print("Ctrl-C stops it.", file=out)
            out.flush()
            stop = trio.Event()

            async def shutdown() -> None:
                await stop.wait()
                app.hub.close()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(_on_sigterm, stop)
                if task_status is not None:
                    task_status.started(app)
                try:
                    await serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]
                finally:
                    nursery.cancel_scope.cancel()
    except ReviewerError as exc:
        print(f"trioloop serve: {exc}", file=sys.stderr)
        return 2
    except (JournalStoreError, OSError, ValueError) as exc:
        print(f"trioloop serve: {exc}", file=sys.stderr)
        return 1
    return 0


async def _on_sigterm(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            stop.set()
            return


def serve_main(args: argparse.Namespace) -> int:
    """Run ``trioloop serve`` (Ctrl-C ends it cleanly): the exit status."""
    import hypercorn.trio  # noqa: F401 -- loaded before the start-up heap is frozen

    freeze_startup_heap()
    try:
        return trio.run(run_serve, args)
    except KeyboardInterrupt:
        print("trioloop serve: stopped", file=sys.stderr)
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trioloop serve", description="Serve the review inbox over a journal store.")
    add_serve_arguments(parser)
    return serve_main(parser.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
