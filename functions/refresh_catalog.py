import azure.functions as func

from shared.models import ConnectionMessage
from shared.queues import Queue
from shared.services.stepctx import run_step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Queue.refresh_catalog.value, connection="AzureWebJobsStorage")
def refresh_catalog(msg: func.QueueMessage) -> None:
    from shared.services import catalog

    run_step("refresh_catalog", msg.get_body(), ConnectionMessage, catalog.refresh_from_message)


# Hourly: prices change rarely; a failed refresh keeps the last good copy.
@bp.timer_trigger(arg_name="timer", schedule="0 7 * * * *", run_on_startup=False)
def refresh_catalog_timer(timer: func.TimerRequest) -> None:
    from shared.log import log_context
    from shared.services import catalog

    with log_context(step="refresh_catalog_timer"):
        catalog.queue_all_refreshes()
