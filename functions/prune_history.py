import azure.functions as func

from shared.context import invocation
from shared.log import get_logger, log_context
from shared.services.timers import prune_history as service

bp = func.Blueprint()


# Hourly: an ended run's events and logs are pruned within its org's retention plus an hour.
@bp.timer_trigger(arg_name="timer", schedule="0 23 * * * *", run_on_startup=False)
def prune_history(timer: func.TimerRequest) -> None:
    with log_context(step="prune_history"):
        get_logger().info("prune history", extra=service.prune_all(invocation()))
