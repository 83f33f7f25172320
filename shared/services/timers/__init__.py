"""The timer-triggered checks: heartbeat_check (deadlines, re-sends), sweeper (leaks, stuck releases),
refresh_catalogs (hourly price refresh)."""
