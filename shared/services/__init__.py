"""What the function handlers call, grouped by what triggers it:

- api/: what the HTTP routes call, one module per resource (runs/ split by what a caller does).
- steps/: the queue-triggered steps, one module per step, named as the step (the step table is
  shared/steps.py), and runner (parse, log, record a step's failure).
- timers/: the timer-triggered checks (heartbeat_check, sweeper, the hourly catalog refresh).

What several of them share about a run (its state moves, timeline, scope, machine, ids, forecast,
and the org's backends built from its connections) is in shared/runs/; the errors they raise are in
shared/errors.py. A step or timer imports no api module, except launch (the dataset check and the
org's Hugging Face token) and the sweeper started from the admin API (admin imports the timer, not
the other way).
"""
