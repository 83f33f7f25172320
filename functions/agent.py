from typing import Any

import azure.functions as func

from shared import http
from shared.models import AgentComplete, Heartbeat, HeartbeatReply
from shared.security import authenticate_agent
from shared.services import agent

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


def _token_exp(header: str | None) -> float | None:
    """The expiry of a token authenticate_agent has verified already (so it is read unverified here)."""
    import jwt

    try:
        claims: dict[str, Any] = jwt.decode((header or "").split(" ", 1)[-1].strip(),
                                            options={"verify_signature": False})
        return float(claims["exp"])
    except (jwt.PyJWTError, KeyError, TypeError, ValueError):
        return None


@bp.route(route="agent/runs/{id}/heartbeat", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent heartbeat: phase, progress, log lines (the run's own token only); the reply says "
          "whether to stop and may carry a renewed token", request=Heartbeat, response=HeartbeatReply)
def heartbeat(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    header = req.headers.get("Authorization")
    return http.respond(lambda: agent.heartbeat(
        authenticate_agent(header, run_id), run_id, http.parse(req, Heartbeat), token_exp=_token_exp(header)))


@bp.route(route="agent/runs/{id}/complete", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent completion: adapter sha256, or the trainer's failure (with whether output exists)",
          request=AgentComplete)
def complete(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    return http.respond(lambda: agent.complete(
        authenticate_agent(req.headers.get("Authorization"), run_id), run_id, http.parse(req, AgentComplete)))
