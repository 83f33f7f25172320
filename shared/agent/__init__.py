"""The on-machine agent (runs beside the trainer on a VM, pod or local process) and the smoke trainer."""
