import azure.functions as func

from shared import http
from shared.models import AgentComplete, Heartbeat
from shared.security import authenticate_agent
from shared.services import agent

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="agent/runs/{id}/heartbeat", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent heartbeat: phase, progress, log lines (the run's own token only)", request=Heartbeat)
def heartbeat(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    return http.respond(lambda: agent.heartbeat(
        authenticate_agent(req.headers.get("Authorization"), run_id), run_id, http.parse(req, Heartbeat)))


@bp.route(route="agent/runs/{id}/complete", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent completion: adapter sha256, or the trainer's failure", request=AgentComplete)
def complete(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    return http.respond(lambda: agent.complete(
        authenticate_agent(req.headers.get("Authorization"), run_id), run_id, http.parse(req, AgentComplete)))
