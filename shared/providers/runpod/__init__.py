"""RunPod compute: one pod per run, named `tensorant-<deployment>-<run id>` (RunPod has no tags)."""
