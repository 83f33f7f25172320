import azure.functions as func

from shared.context import invocation
from shared.log import log_context
from shared.services.timers import sweeper as service

bp = func.Blueprint()


# Every 5 minutes (Azure's network API throttles frequent listing): leaks are found within
# one grace period plus one tick. The tick only sends one sweep-account message per connection.
@bp.timer_trigger(arg_name="timer", schedule="30 */5 * * * *", run_on_startup=False)
def sweeper(timer: func.TimerRequest) -> None:
    with log_context(step="sweeper"):
        service.tick(invocation())
