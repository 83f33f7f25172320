"""`tensorant`: the command line for the Tensorant control plane API.

Environment: TENSORANT_URL (default http://localhost:7071) and TENSORANT_TOKEN (a bearer
token; `tensorant dev-token` mints one for a local control plane). Exit codes: 0 ok,
1 the API refused or failed (its problem+json is printed) or a run ended badly, 2 usage errors.
Objects print as text; `--json` prints them as the API returned them, `-q` prints only ids.

Each command is a module of tensorant_cli.commands with its parser beside its functions; this
module builds the top-level parser from them and turns what a command raises into exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys

from tensorant_cli.client import Client, render_error
from tensorant_cli.commands import (
    admin,
    base_models,
    catalog,
    connections,
    datasets,
    dev_token,
    projects,
    runs,
    usage,
    webhooks,
)
from tensorant_cli.commands.common import FORMATTER, UsageError
from tensorant_cli.output import say
from tensorant_client.errors import ApiError

__all__ = ["build_parser", "main"]

# In the order `tensorant --help` lists them.
COMMANDS = (dev_token, connections, projects, datasets, catalog, usage, runs, base_models, webhooks, admin)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorant", description=__doc__.split("\n\n")[0],
                                epilog="example:\n  tensorant runs list\n  tensorant runs watch --last",
                                formatter_class=FORMATTER)
    p.add_argument("--url", default=os.environ.get("TENSORANT_URL", "http://localhost:7071"),
                   help="control plane URL (env TENSORANT_URL)")
    p.add_argument("--token", default=os.environ.get("TENSORANT_TOKEN"), help="bearer token (env TENSORANT_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = Client(args.url, args.token)
    try:
        code: int = args.fn(args, client)
        sys.stdout.flush()
    except ApiError as exc:
        # Rendered line by line, in the CLI's words; a hint that names the run names this one.
        print(render_error(exc, run_id=str(getattr(args, "id", None) or "<RUN_ID>")), file=sys.stderr)
        return 1
    except UsageError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tensorant catalog | head`): stop quietly, as other tools do.
        # Python would report the pipe again at exit when it flushes stdout, so point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file that cannot be read
        say(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
