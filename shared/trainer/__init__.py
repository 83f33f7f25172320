"""The trainers the agent runs: the real LoRA trainer (lora) and the smoke trainer."""
