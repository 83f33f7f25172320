"""The run domain, shared by the API, the steps and the timers: lifecycle (the state table and
transition), moves (the one way a run's state is written), steps (the step table), events (the
timeline), resources, scope (a held machine and its connection's scope), machine (stopping a
machine started for recovery), cloud_report (what the cloud says of a machine that never started),
forecast (time and cost before launch) and ids."""
