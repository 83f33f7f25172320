"""`tensorant dev-token`: a token for a local control plane, minted with its own JWT secret."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import leaf
from tensorant_cli.output import say


def add_parser(sub: Any) -> None:
    t = leaf(sub, "dev-token", "mint a development token with the local JWT secret (prints it only)",
             "export TENSORANT_TOKEN=$(tensorant dev-token --org demo --role owner)", objects=False)
    # The org `make run` prints a token for and the README's quickstart uses: one org throughout.
    t.add_argument("--org", default="demo")
    t.add_argument("--role", default="owner", choices=["owner", "member", "admin"])
    t.add_argument("--sub", default="dev-user")
    t.add_argument("--ttl", type=int, default=12 * 3600, help="lifetime in seconds")
    t.set_defaults(fn=cmd_dev_token)


def cmd_dev_token(args: argparse.Namespace, client: Client) -> int:
    # Minted by the control plane's own code with its settings, so the token is exactly what
    # the local host accepts; those modules exist only where the app and dev host are installed.
    try:
        from shared.models import Role
        from shared.security import mint_user_token
        from shared.settings import reset_settings
        from tensorant_devhost.config import load_local_settings
    except ImportError as exc:
        say(f"error: dev-token needs the control plane and its dev host installed beside the CLI ({exc}); "
            "run it in the repository's environment (`make install`)", file=sys.stderr)
        return 2

    # The same JWT secret as the local host, which reads local.settings.json too.
    load_local_settings(Path.cwd() / "local.settings.json")
    reset_settings()
    from shared.settings import get_settings

    try:
        settings = get_settings()
    except ValueError as exc:  # production settings that fail their checks: production either way
        say(f"error: dev-token does not run here: {exc}", file=sys.stderr)
        return 2
    if settings.is_production:
        # Minting with the production secret would hand out a valid admin token with no login.
        say("error: dev-token refuses to mint tokens with production settings (TENSORANT_ENV=production); "
            "production users get their tokens from the identity provider", file=sys.stderr)
        return 2
    try:
        token = mint_user_token(args.sub, args.org, Role(args.role), ttl_s=args.ttl)
    except ValueError as exc:  # --ttl over the maximum lifetime, or an org/sub that is no id
        say(f"error: {exc}", file=sys.stderr)
        return 2
    say(token)
    return 0
