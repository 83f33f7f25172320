"""The machine's payload: what runs on the customer's GPU machine (the agent and the trainer).

A deployable of its own: the training image copies machine/ and adapter_format/ (Dockerfile), never
shared/ (the control plane). tests/test_layers.py holds the import rules between the three packages.
"""
