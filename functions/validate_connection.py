import azure.functions as func

from shared.models import ConnectionMessage
from shared.queues import Queue
from shared.services.stepctx import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Queue.validate_connection.value, connection="AzureWebJobsStorage")
def validate_connection(msg: func.QueueMessage) -> None:
    from shared.services import connections

    run_step("validate_connection", msg.get_body(), ConnectionMessage,
             lambda m: connections.validate_connection(m.org, m.slot))
