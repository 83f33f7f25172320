"""A local Functions host: serves a FunctionApp's HTTP routes, polls its queues, fires its timers.

Azure Functions Core Tools cannot be installed here; this host runs exactly the
functions the app registered, with host.json's queue semantics. Where Core Tools
exist, `func start` runs the same app unchanged.
"""

from tensorant_devhost.host import Host, HostConfig, load_local_settings

__all__ = ["Host", "HostConfig", "load_local_settings"]
