"""The on-machine agent (runs beside the trainer on a VM, pod or local process).

Standard library and this package only: it runs in the training image, which holds
no part of the function app.
"""
