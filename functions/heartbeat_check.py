import azure.functions as func

from shared.context import invocation
from shared.log import get_logger, log_context
from shared.services.timers import heartbeat_check as service

bp = func.Blueprint()


# Every minute: deadlines are minutes long, and a missed one must stop billing soon.
@bp.timer_trigger(arg_name="timer", schedule="0 * * * * *", run_on_startup=False)
def heartbeat_check(timer: func.TimerRequest) -> None:
    with log_context(step="heartbeat_check"):
        get_logger().info("heartbeat check", extra=service.check_all(invocation()))
