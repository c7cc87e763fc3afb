"""Which asked trial is measured, and when a study has nothing left to measure (pure: no Ray, no
Optuna, no storage; configurations are identities, `space.config_identity`).

Rules, the same one trial at a time and in parallel:

- a proposal whose configuration is running now, or already known (a finished trial that is not a
  plain failure: COMPLETE, pruned, invalid), is a duplicate and is not measured by chance. The
  driver tells it PRUNED with its twin's number (`spectune.duplicate_of`): it never counts toward
  `study.n_trials` and never enters the noise band, and a sampler that learns from pruned trials
  (TPE) moves away from measured points;
- a trial the study asked for (an enqueued one: the baseline, a retry, a pick of this rule, a race
  repeat of a leader, orchestrator/search/racing.py) is measured whatever it repeats;
- `MAX_DUPLICATES` duplicates in a row: the study picks an unknown configuration of the space itself
  (at random, from the enumerated space), so a sampler stuck on known points cannot stall a study;
  when every configuration not known is running (or an unbounded space's sampler is stuck), the
  driver stops asking until a running trial ends (`after_duplicate`), rather than spin;
- a finite space whose every distinct configuration is known is exhausted: the study ends there,
  also when `study.n_trials` is larger than the space;
- a gang whose launch failed for good twice in this run, on fresh launches (a rank out of memory, a
  model it cannot build: orchestrator/execution/pool.py; twice, since memory a killed gang had not yet
  given back, or a neighbour's, can fail one launch) is not launched again by this driver: a proposal
  that needs it, asked or not, is told PRUNED naming the trials that failed, and every configuration on
  it counts as known for the two rules above (`ruled_out`). Only this run's failures count: a resumed
  study tries such a gang again (the user may have freed the memory).

    book = Proposals(space=distinct_configs(cfg), rng=random.Random(0))
    book.known("k=0 ...", 0)                        # a finished trial's configuration
    verdict = book.admit(7, identity, asked=False)  # Admission(run=True) or a duplicate's twin
    book.finished(7, known=True)                    # the running trial ended
    book.unlaunchable("3f9a...", 7, "GangError: setup: rank 0: OutOfMemoryError ...")   # twice: ruled out
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

MAX_DUPLICATES = 8  # proposals in a row that repeat known configurations before the study picks one itself
LAUNCH_FAILURES = 2  # failed launches of one gang (each on a fresh launch) that rule it out for the run


@dataclass(frozen=True)
class Admission:
    """Whether an asked trial is measured; if not, the trial it repeats and why (one line)."""

    run: bool
    twin: int | None = None
    reason: str | None = None


class Proposals:
    """The configurations known to the study and running now, by identity."""

    def __init__(
        self, space: dict[str, dict] | None, rng: random.Random | None = None, gang_of: Callable[[dict], str | None] | None = None
    ):
        # space: every distinct configuration of a finite space -> the params that enqueue it (None: unbounded)
        # gang_of: a configuration's params -> the gang it runs on (None: no gang can be ruled out)
        self.space = space
        self.rng = rng or random.Random(0)
        self.gang_of = gang_of
        self._launch_failures: dict[str, list[tuple[int, str]]] = {}  # gang -> (trial whose launch failed, why), in order
        self._gangs: dict[str, str | None] = {}  # a space configuration's identity -> its gang (gang_of, cached)
        self._known: dict[str, int] = {}  # identity -> the first trial that measured it
        self._running: dict[int, str] = {}  # trial number -> identity
        self._others: dict[str, int] = {}  # identities other drivers are measuring now -> their trials
        self.duplicates_in_a_row = 0

    def known(self, identity: str, number: int) -> None:
        self._known.setdefault(identity, number)

    def others_running(self, identities: dict[str, int]) -> None:
        """Configurations other drivers of the study are measuring now -> their trials (refreshed before each ask)."""
        self._others = dict(identities)

    def unlaunchable(self, gang: str, number: int, reason: str) -> bool:
        """Trial `number`'s gang failed its launch for good (`reason`). Returns whether that rules the gang
        out: its LAUNCH_FAILURES-th such failure in this run."""
        self._launch_failures.setdefault(gang, []).append((number, reason))
        return self.gang_ruled_out(gang)

    def gang_ruled_out(self, gang: str | None) -> bool:
        return len(self._launch_failures.get(gang, ())) >= LAUNCH_FAILURES

    @property
    def rules_out_gangs(self) -> bool:
        """Some gang is ruled out in this run (until then no proposal's gang needs working out)."""
        return any(len(f) >= LAUNCH_FAILURES for f in self._launch_failures.values())

    def _ruled_out(self, identity: str, params: dict) -> bool:
        """The configuration runs on a gang that failed its launch in this run."""
        if self.gang_of is None or not self.rules_out_gangs:
            return False
        if identity not in self._gangs:
            self._gangs[identity] = self.gang_of(params)
        return self.gang_ruled_out(self._gangs[identity])

    def admit(self, number: int, identity: str | None, asked: bool, gang: str | None = None) -> Admission:
        """An asked trial: measured (and then running), or a duplicate of a running or known one, or one
        whose `gang` failed its launch in this run. `identity` None (a configuration that cannot resolve)
        is measured: the trial prunes it with its reason."""
        if gang is not None and self.gang_ruled_out(gang):
            self.duplicates_in_a_row += 1
            failures = self._launch_failures[gang]
            failed, why = " and ".join(str(n) for n, _ in failures), failures[-1][1]
            return Admission(
                False, failures[0][0], f"its gang failed to launch in trials {failed} ({why[:160]}); not launched again in this run"
            )
        if identity is not None and not asked:
            twin = next((n for n, i in self._running.items() if i == identity), None)
            if twin is None and identity in self._others:
                twin = self._others[identity]
                self.duplicates_in_a_row += 1
                why = f"duplicate of trial {twin}, which another driver is measuring: one configuration is not measured twice at once"
                return Admission(False, twin, why)
            if twin is not None:
                self.duplicates_in_a_row += 1
                return Admission(False, twin, f"duplicate of running trial {twin}: one configuration is not measured twice at once")
            if (twin := self._known.get(identity)) is not None:
                self.duplicates_in_a_row += 1
                return Admission(False, twin, f"duplicate of trial {twin}: this configuration is measured already")
        self.duplicates_in_a_row = 0
        if identity is not None:
            self._running[number] = identity
        return Admission(True)

    def finished(self, number: int, known: bool) -> None:
        """A measured trial ended; `known`: its configuration counts as measured (not a plain failure,
        whose params are retried)."""
        identity = self._running.pop(number, None)
        if identity is not None and known:
            self.known(identity, number)

    def busy_identities(self) -> set[str]:
        """Configurations being measured now, by this driver or (as of the last refresh) by another."""
        return set(self._running.values()) | set(self._others)

    def untried(self) -> list[dict]:
        """Params of the space's configurations neither known nor running (empty for an unbounded space)."""
        if self.space is None:
            return []
        busy = set(self._known) | set(self._running.values()) | set(self._others)
        return [params for identity, params in self.space.items() if identity not in busy and not self._ruled_out(identity, params)]

    def pick_untried(self) -> dict | None:
        """The study's own pick when the sampler keeps repeating itself: an unknown configuration at random."""
        self.duplicates_in_a_row = 0
        left = self.untried()
        return self.rng.choice(left) if left else None

    def after_duplicate(self) -> dict | None | bool:
        """What the driver does after a duplicate: params of an unknown configuration to enqueue (the
        sampler keeps repeating itself), False to wait for a running trial to end (nothing new is left
        to try while those run, or an unbounded space's sampler is stuck), or None to ask again."""
        if self.space is not None and not self.untried():
            return False  # every configuration not known is running: asking again only repeats them
        if not self.stuck:
            return None
        pick = self.pick_untried()
        return pick if pick is not None else False

    @property
    def stuck(self) -> bool:
        return self.duplicates_in_a_row >= MAX_DUPLICATES

    @property
    def exhausted(self) -> bool:
        """Every distinct configuration of a finite space is known (or runs on a gang that cannot launch)."""
        return self.space is not None and all(
            identity in self._known or self._ruled_out(identity, params) for identity, params in self.space.items()
        )

    @property
    def ruled_out(self) -> int:
        """Configurations of a finite space not known and on a gang ruled out in this run."""
        if self.space is None:
            return 0
        return sum(1 for identity, params in self.space.items() if identity not in self._known and self._ruled_out(identity, params))

    @property
    def size(self) -> int | None:
        return None if self.space is None else len(self.space)
