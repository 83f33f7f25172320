import azure.functions as func

from shared import http
from shared.models import OrgMlflowSet, OrgSecretSet, OrgSecretsView, OrgWandbSet
from shared.services.api import org_secrets

bp = func.Blueprint()
ANON = func.AuthLevel.ANONYMOUS


@bp.route(route="org/secrets", methods=["GET"], auth_level=ANON)
@http.api(summary="Which organization secrets are set (owners; values are never returned)", response=OrgSecretsView)
def list_org_secrets(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.show(ctx, http.principal(ctx, req)))


@bp.route(route="org/secrets/huggingface-token", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save the Hugging Face token (owners; write-only, sealed at rest, handed only to the trainer)",
          request=OrgSecretSet, response=OrgSecretsView)
def put_hf_token(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.set_hf_token(ctx, http.principal(ctx, req), http.parse(req, OrgSecretSet)))


@bp.route(route="org/secrets/huggingface-token", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete the Hugging Face token (owners)", status=204)
def delete_hf_token(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.delete_hf_token(ctx, http.principal(ctx, req)))


@bp.route(route="org/secrets/mlflow", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save the MLflow tracking server the trainer logs to (owners; write-only, sealed at rest, handed "
                  "only to the trainer)", request=OrgMlflowSet, response=OrgSecretsView)
def put_mlflow(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.set_mlflow(ctx, http.principal(ctx, req), http.parse(req, OrgMlflowSet)))


@bp.route(route="org/secrets/mlflow", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete the MLflow tracking server (owners)", status=204)
def delete_mlflow(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.delete_tracker(ctx, http.principal(ctx, req), org_secrets.MLFLOW))


@bp.route(route="org/secrets/wandb", methods=["PUT"], auth_level=ANON)
@http.api(summary="Save the Weights & Biases API key the trainer logs with (owners; write-only, sealed at rest, "
                  "handed only to the trainer)", request=OrgWandbSet, response=OrgSecretsView)
def put_wandb(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.set_wandb(ctx, http.principal(ctx, req), http.parse(req, OrgWandbSet)))


@bp.route(route="org/secrets/wandb", methods=["DELETE"], auth_level=ANON)
@http.api(summary="Delete the Weights & Biases API key (owners)", status=204)
def delete_wandb(req: func.HttpRequest) -> func.HttpResponse:
    return http.respond(lambda ctx: org_secrets.delete_tracker(ctx, http.principal(ctx, req), org_secrets.WANDB))
