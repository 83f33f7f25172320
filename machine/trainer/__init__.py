"""Trainer processes the agent runs as TENSORANT_TRAINER_COMMAND."""
