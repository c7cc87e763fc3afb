"""Execution: what `spectune validate` checks against the model and this machine (`validate`),
the workload a gang runs (`workload`: prompts tokenized once, per-trial gang specs), connecting to
a Ray cluster and placing gangs (`cluster`, `slots`: one trial per host at a time), and the gangs
themselves (`gang`, `pool`)."""
