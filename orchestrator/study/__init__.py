"""The study: the Optuna loop (`loop`: create or load, recover stale trials, the baseline, ask and
tell), one trial in phases (`trial`), ranking and noise (`ranking`), greedy-output equivalence
(`equivalence`), Optuna storage and its lock (`storage`), driver records and the watchdog
(`drivers`) and the names every record is keyed by (`keys`)."""
