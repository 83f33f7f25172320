"""The queue-triggered steps, one module per step named as the step, each with one handler of the
same name that functions/<step>.py passes to runner.run_step. Which run states each serves, and who
re-sends a lost message, is the step table (shared/steps.py)."""
