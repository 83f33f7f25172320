"""The refresh-catalog step's queue trigger (handler: shared/services/steps/refresh_catalog.py;
message: the step table, shared/steps.py), and its hourly timer."""

import azure.functions as func

from shared.context import invocation
from shared.log import log_context
from shared.services.steps import refresh_catalog as step
from shared.services.steps.runner import run_step
from shared.services.timers import refresh_catalogs
from shared.steps import Step

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=Step.refresh_catalog.value, connection="AzureWebJobsStorage")
def refresh_catalog(msg: func.QueueMessage) -> None:
    run_step(Step.refresh_catalog, msg.get_body(), step.refresh_catalog)


# Hourly: prices change rarely; a failed refresh keeps the last good copy.
@bp.timer_trigger(arg_name="timer", schedule="0 7 * * * *", run_on_startup=False)
def refresh_catalog_timer(timer: func.TimerRequest) -> None:
    with log_context(step="refresh_catalog_timer"):
        refresh_catalogs.queue_all_refreshes(invocation())
