"""`spectune report EXP.yaml`: why the winner wins, as a verdict (see core.py for what it holds).

core.py     build_report / report: the study's trials -> files (and the parent MLflow run)
rows.py     one row per trial: configuration, objective + noise band, breakeven, time per token
verdict.py  the words: first paragraph and the terminal text
engines.py  the winner's allreduce in each serving engine, and what an engine without it keeps of the win
charts.py   the charts, labelled by configuration
page.py     the self-contained HTML page
"""

from orchestrator.explain.report.core import after_run, best_yaml, build_report, log_report, report

__all__ = ["after_run", "best_yaml", "build_report", "log_report", "report"]
