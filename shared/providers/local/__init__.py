"""The `local` compute provider: each run's "machine" is an agent process on this host."""
