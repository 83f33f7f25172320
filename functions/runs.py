import azure.functions as func

from shared import http
from shared.models import RunCancel, RunCreate, RunLaunch, RunRecover, RunView
from shared.services import runs

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="runs", methods=["POST"], auth_level=ANON)
@http.api(summary="Save a run draft with its price estimate (nothing is rented)", request=RunCreate,
          response=RunView, status=201)
def create_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.create(http.principal(req), http.parse(req, RunCreate)), status=201)


@bp.route(route="runs", methods=["GET"], auth_level=ANON)
@http.api(summary="List runs")
def list_runs(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.list_runs(http.principal(req)))


@bp.route(route="runs/{id}", methods=["GET"], auth_level=ANON)
@http.api(summary="A run: state, phase, progress, estimate, resources, events", response=RunView)
def get_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.get(http.principal(req), req.route_params["id"]))


@bp.route(route="runs/{id}/logs", methods=["GET"], auth_level=ANON)
@http.api(summary="Training log lines reported by the agent")
def run_logs(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.logs(http.principal(req), req.route_params["id"]))


@bp.route(route="runs/{id}/launch", methods=["POST"], auth_level=ANON)
@http.api(summary="Launch a draft (confirm: true); refused above the price limit", request=RunLaunch,
          response=RunView, status=202)
def launch_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.launch(http.principal(req), req.route_params["id"], http.parse(req, RunLaunch)),
                        status=202)


@bp.route(route="runs/{id}/cancel", methods=["POST"], auth_level=ANON)
@http.api(summary="Cancel: discard releases the machine and disk; discard false keeps the disk",
          request=RunCancel, response=RunView, status=202)
def cancel_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.cancel(http.principal(req), req.route_params["id"], http.parse(req, RunCancel)),
                        status=202)


@bp.route(route="runs/{id}/recover", methods=["POST"], auth_level=ANON)
@http.api(summary="Recover a retained run: upload adapter.zip (application/zip) or verify the saved one",
          request=(RunRecover, "application/zip"), response=RunView, status=202)
def recover_run(req: func.HttpRequest) -> func.HttpResponse:
    is_zip = (req.headers.get("Content-Type") or "").startswith(("application/zip", "application/octet-stream"))
    return http.respond(lambda: runs.recover(
        http.principal(req), req.route_params["id"],
        upload=http.upload_body(req, what="the adapter archive", larger=(
            "put it in storage at runs/<RUN_ID>/adapter.zip and recover with mode verify_saved")) if is_zip else None,
        body=None if is_zip else http.parse(req, RunRecover)), status=202)


@bp.route(route="runs/{id}/release", methods=["POST"], auth_level=ANON)
@http.api(summary="Retry a release that the cloud has not confirmed yet", response=RunView, status=202)
def release_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda: runs.retry_release(http.principal(req), req.route_params["id"]), status=202)
