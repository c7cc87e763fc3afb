"""The study: the Optuna loop (`loop`: create or load, recover stale trials, the baseline, ask and
tell), running trials on the slots of a cluster (`runner` assembles the trial loop; `controller`
wires its parts: the searcher `asker`, the goal `goal`, the failure policy `failures`, the trial
threads `threads`; what they share, `context`), one trial in phases (`trial`), greedy-output
equivalence (`equivalence`), the lock that keeps two drivers from asking at once (`ask_lock`) and
driver records and the watchdog (`drivers`). What to measure next, racing and who leads is
orchestrator/search/; the slots themselves, orchestrator/execution/; the names every record is
keyed by, orchestrator/record.py."""
