"""Recording for people: MLflow runs (`runs`: a parent run per study, a nested run per trial) and the
terminal progress lines (`progress`)."""
