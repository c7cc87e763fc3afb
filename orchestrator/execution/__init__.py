"""Execution on Ray: connecting to a cluster and placing gangs (`cluster`), the workload a gang runs
(`workload`: prompts tokenized once, per-trial gang specs)."""
