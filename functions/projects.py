import azure.functions as func

from shared import http
from shared.models import DatasetVersionRecord, ProjectCreate, ProjectRecord
from shared.services.api import projects
from shared.services.api.projects import DatasetCommit

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="projects", methods=["POST"], auth_level=ANON)
@http.api(summary="Create a project", request=ProjectCreate, response=ProjectRecord, status=201)
def create_project(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: projects.create_project(ctx, http.principal(ctx, req), http.parse(req, ProjectCreate)),
                        status=201)


@bp.route(route="projects", methods=["GET"], auth_level=ANON)
@http.api(summary="List projects, a page at a time (limit, cursor=<next>)")
def list_projects(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: projects.list_projects(ctx, http.principal(ctx, req), req.params.get("limit"),
                                                       req.params.get("cursor")))


@bp.route(route="projects/{id}/datasets", methods=["POST"], auth_level=ANON)
@http.api(summary="Upload a JSONL dataset version (each line validated)", request="application/x-ndjson",
          response=DatasetVersionRecord, status=201)
def upload_dataset(req: func.HttpRequest) -> func.HttpResponse:
    # The principal first: an anonymous caller learns nothing about the limits.
    return http.respond(lambda ctx: projects.upload_dataset(
        ctx, http.principal(ctx, req), req.route_params["id"],
        http.upload_body(req, what="the dataset", larger=LARGER)), status=201)


LARGER = "upload larger datasets directly to storage: POST /api/projects/{id}/datasets/upload-url, then .../commit"


@bp.route(route="projects/{id}/datasets/upload-url", methods=["POST"], auth_level=ANON)
@http.api(summary="A presigned PUT URL for a dataset too large for the API (S3 / RunPod volume storage)")
def dataset_upload_url(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: projects.dataset_upload_url(ctx, http.principal(ctx, req), req.route_params["id"]))


@bp.route(route="projects/{id}/datasets/commit", methods=["POST"], auth_level=ANON)
@http.api(summary="Validate a directly uploaded dataset (streamed from storage) and save it as a version",
          request=DatasetCommit, response=DatasetVersionRecord, status=201)
def commit_dataset(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: projects.commit_dataset(ctx, http.principal(ctx, req), req.route_params["id"],
                                                        http.parse(req, DatasetCommit).model_dump()), status=201)


@bp.route(route="projects/{id}/datasets", methods=["GET"], auth_level=ANON)
@http.api(summary="List a project's dataset versions, a page at a time (limit, cursor=<next>)")
def list_datasets(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: projects.list_datasets(ctx, http.principal(ctx, req), req.route_params["id"],
                                                       req.params.get("limit"), req.params.get("cursor")))
