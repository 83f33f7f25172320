import azure.functions as func

from shared.models import StepMessage
from shared.queues import Queue
from shared.services.stepctx import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Queue.launch.value, connection="AzureWebJobsStorage")
def launch(msg: func.QueueMessage) -> None:
    from shared.services import steps as service

    run_step("launch", msg.get_body(), StepMessage, service.launch)
