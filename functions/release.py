import azure.functions as func

from shared.models import StepMessage
from shared.queues import Queue
from shared.services.stepctx import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Queue.release.value, connection="AzureWebJobsStorage")
def release(msg: func.QueueMessage) -> None:
    from shared.services import steps as service

    run_step("release", msg.get_body(), StepMessage, service.release)
