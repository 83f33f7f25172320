"""What the function handlers call: one module per step, named as the step (launch,
verify_adapter, retain, release; heartbeat_check and sweeper for the timers; the step table is
shared/runs/steps.py) and one per HTTP resource (connections, catalog, projects, runs, agent,
admin). They share: backends (an org's provider and storage, built from its connections),
run_events (the run's timeline), transitions (guarded state moves) and step_runner (parse,
log, record a step's failure)."""
