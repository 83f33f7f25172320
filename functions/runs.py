import azure.functions as func

from shared import http
from shared.context import Context
from shared.models import RunCancel, RunCreate, RunEstimate, RunLaunch, RunPatch, RunRecover, RunView
from shared.services.api.runs import actions, adapter, checkpoints, drafts, logs, view

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="runs", methods=["POST"], auth_level=ANON)
@http.api(summary="Save a run draft with its price estimate (nothing is rented)", request=RunCreate,
          response=RunView, status=201)
def create_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: drafts.create(ctx, http.principal(ctx, req), http.parse(req, RunCreate)), status=201)


@bp.route(route="runs/forecast", methods=["POST"], auth_level=ANON)
@http.api(summary="The price and forecast of a run request, checked as a create but not saved",
          request=RunCreate, response=RunEstimate)
def forecast_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: drafts.estimate(ctx, http.principal(ctx, req), http.parse(req, RunCreate)))


@bp.route(route="runs", methods=["GET"], auth_level=ANON)
@http.api(summary="List runs, newest first, a page at a time (limit, cursor=<next>; filters state, project)")
def list_runs(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: view.list_runs(ctx, http.principal(ctx, req), limit=req.params.get("limit"),
                                               cursor=req.params.get("cursor"), state=req.params.get("state"),
                                               project=req.params.get("project")))


@bp.route(route="runs/{id}", methods=["GET"], auth_level=ANON)
@http.api(summary="A run: state, phase, progress, estimate, resources, events", response=RunView)
def get_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: view.get(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="runs/{id}", methods=["PATCH"], auth_level=ANON)
@http.api(summary="Edit a draft (any field of a create; drafts only)", request=RunPatch, response=RunView)
def patch_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: drafts.patch(ctx, http.principal(ctx, req), req.route_params["id"],
                                                 http.parse(req, RunPatch)))


@bp.route(route="runs/{id}", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete a draft (drafts only; ended runs stay as a record)", status=204)
def delete_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: drafts.delete(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="runs/{id}/metrics", methods=["GET"], auth_level=ANON)
@http.api(summary="Per-step training loss (and learning rate) from the trainer's progress lines, for a chart: "
          "of the newest 2000 log lines, or of the 2000 after=<line> (next follows); with the evaluations per "
          "evaluated step (a DPO run's preference accuracy and reward margin); rate-limited per org",
          response=logs.RunMetrics)
def run_metrics(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: logs.metrics(ctx, http.principal(ctx, req), req.route_params["id"],
                                             after=req.params.get("after")))


@bp.route(route="runs/{id}/logs", methods=["GET"], auth_level=ANON)
@http.api(summary="Training log lines reported by the agent, a page at a time (after=<next cursor>, limit<=5000)")
def run_logs(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: logs.logs(ctx, http.principal(ctx, req), req.route_params["id"],
                                          after=req.params.get("after"), limit=req.params.get("limit")))


@bp.route(route="runs/{id}/launch", methods=["POST"], auth_level=ANON)
@http.api(summary="Launch a draft (confirm: true); refused above the price limit", request=RunLaunch,
          response=RunView, status=202)
def launch_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: actions.launch(ctx, http.principal(ctx, req), req.route_params["id"],
                                                   http.parse(req, RunLaunch)), status=202)


@bp.route(route="runs/{id}/cancel", methods=["POST"], auth_level=ANON)
@http.api(summary="Cancel: discard releases the machine and disk; discard false keeps the disk",
          request=RunCancel, response=RunView, status=202)
def cancel_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: actions.cancel(ctx, http.principal(ctx, req), req.route_params["id"],
                                                   http.parse(req, RunCancel)), status=202)


@bp.route(route="runs/{id}/recover", methods=["POST"], auth_level=ANON)
@http.api(summary="Recover a retained run: upload adapter.zip (application/zip) or verify the saved one",
          request=(RunRecover, "application/zip"), response=RunView, status=202)
def recover_run(req: func.HttpRequest) -> func.HttpResponse:
    is_zip = (req.headers.get("Content-Type") or "").startswith(("application/zip", "application/octet-stream"))
    return http.respond(lambda ctx: actions.recover(
        ctx, http.principal(ctx, req), req.route_params["id"],
        upload=http.upload_body(req, what="the adapter archive", larger=(
            "put it in storage at runs/<RUN_ID>/adapter.zip and recover with mode verify_saved")) if is_zip else None,
        body=None if is_zip else http.parse(req, RunRecover),
        accept_checkpoint=req.params.get("accept_checkpoint") if is_zip else None), status=202)


@bp.route(route="runs/{id}/release", methods=["POST"], auth_level=ANON)
@http.api(summary="Retry a release that the cloud has not confirmed yet", response=RunView, status=202)
def release_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: actions.retry_release(ctx, http.principal(ctx, req), req.route_params["id"]), status=202)


@bp.route(route="runs/{id}/adapter", methods=["GET"], auth_level=ANON)
@http.api(summary="The verified adapter of a succeeded run: application/zip (local storage, header "
                  "X-Adapter-Sha256) or a short-lived download URL (S3, RunPod volume); 409 before. ?format=merged: "
                  "the adapter merged into the base model (training.merged), 404 when the run has none. "
                  "?checkpoint=<step>: a kept checkpoint's adapter, in any state of the run",
          response="adapter download")
def run_adapter(req: func.HttpRequest) -> func.HttpResponse:
    def call(ctx: Context) -> object:
        step = req.params.get("checkpoint")
        got = (checkpoints.download(ctx, http.principal(ctx, req), req.route_params["id"], step) if step is not None
               else adapter.adapter(ctx, http.principal(ctx, req), req.route_params["id"], req.params.get("format")))
        if isinstance(got, adapter.AdapterStream):
            return func.HttpResponse(got.data, status_code=200, mimetype="application/zip", headers={
                **http.NO_STORE, "Content-Type": "application/zip", "X-Adapter-Sha256": got.sha256,
                "Content-Disposition": f'attachment; filename="{got.filename}"'})
        return got

    return http.respond(call)


@bp.route(route="runs/{id}/checkpoints", methods=["GET"], auth_level=ANON)
@http.api(summary="The run's kept checkpoint adapters (the newest training.keep_checkpoints): step, saved_at, "
                  "train_loss, eval_loss, size, sha256; download one with GET /api/runs/{id}/adapter?checkpoint=<step>")
def run_checkpoints(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: checkpoints.checkpoints(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="runs/{id}/stop", methods=["POST"], auth_level=ANON)
@http.api(summary="Stop a retained run's machine that was started for recovery (its disk is kept)",
          response=RunView, status=202)
def stop_run(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: actions.stop(ctx, http.principal(ctx, req), req.route_params["id"]), status=202)
