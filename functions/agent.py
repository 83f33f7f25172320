import azure.functions as func

from shared import http
from shared.context import Context
from shared.models import (
    AgentComplete,
    BootFailure,
    BootstrapClaim,
    BootstrapGrant,
    Heartbeat,
    HeartbeatReply,
    RestartGrant,
)
from shared.services.api import agent, boot

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="agent/runs/{id}/heartbeat", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent heartbeat: phase, progress, log lines (the run's own token only); the reply says "
          "whether to stop and may carry a renewed token", request=Heartbeat, response=HeartbeatReply)
def heartbeat(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]

    def beat(ctx: Context) -> dict[str, object]:
        token = agent.verify(ctx, req.headers.get("Authorization"), run_id)
        return agent.heartbeat(ctx, token.org, run_id, http.parse(req, Heartbeat), token=token)

    return http.respond(beat)


@bp.route(route="agent/runs/{id}/complete", methods=["POST"], auth_level=ANON)
@http.api(summary="Agent completion: adapter sha256, or the trainer's failure (with whether output exists)",
          request=AgentComplete)
def complete(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    return http.respond(lambda ctx: agent.complete(
        ctx, agent.verify(ctx, req.headers.get("Authorization"), run_id).org, run_id, http.parse(req, AgentComplete)))


@bp.route(route="agent/runs/{id}/boot-failed", methods=["POST"], auth_level=ANON)
@http.api(summary="The machine's own report that training never started (image pull, container start or agent "
          "failed before the agent reported): the run is released as failed", request=BootFailure)
def boot_failed(req: func.HttpRequest) -> func.HttpResponse:
    run_id = req.route_params["id"]
    return http.respond(lambda ctx: boot.boot_failed(
        ctx, agent.verify(ctx, req.headers.get("Authorization"), run_id).org, run_id, http.parse(req, BootFailure)))


@bp.route(route="agent/runs/{id}/bootstrap", methods=["POST"], auth_level=ANON)
@http.api(summary="The machine's one-time exchange of the claim in its user data for its environment (run "
          "token, storage access): accepted once, while the run is provisioning; a second is refused and recorded",
          request=BootstrapClaim, response=BootstrapGrant)
def bootstrap(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: boot.exchange_claim(ctx, req.route_params["id"], http.parse(req, BootstrapClaim)))


@bp.route(route="agent/runs/{id}/restart", methods=["POST"], auth_level=ANON)
@http.api(summary="The agent of a retained machine started again (recover start_machine or resume) exchanges its "
          "token, which may have expired while the machine was stopped, for a fresh one and fresh storage access: "
          "accepted once per start, for a token issued before it; a second is refused and recorded",
          response=RestartGrant)
def restart(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: boot.exchange_restart(ctx, req.headers.get("Authorization"), req.route_params["id"]))
