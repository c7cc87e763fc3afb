"""Why the winner wins: the performance model of a decode step (`perfmodel`), its leave-one-out
check (`perfcheck`) and `spectune report` (`report/`)."""
