"""Where a study's record is kept: the Optuna storage (`storage`: URL, creation, its lock), MLflow
runs (`runs`: a parent run per study, a nested run per trial; `local_store`: the embedded SQLite
store) and the terminal progress lines (`progress`)."""
