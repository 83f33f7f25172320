"""A run's candidates (issue 37): the ordered (connection, offer) pairs its launch may use, the one
tried now, and the dearest one still ahead, whose price every check, forecast and budget uses.

A run without `candidates` has one: its provider's default connection and its offer. `run.provider` and
`run.offer` always hold the current candidate's, so code that knows nothing of candidates stays right.
The launch step moves to the next candidate on a capacity, quota or stock refusal (launch.py); an
attempt's index is carried by the marks of what it creates (RunRef.attempt), so the sweeper can tell an
abandoned attempt's machine from the live one.
"""

from __future__ import annotations

from shared.models import CandidateView, GpuOffer, RunAttempt, RunCandidate, RunRecord


def provider_of(name: str) -> str:
    """The provider of a connection name: `aws/us-west-2` -> `aws`, `aws` -> `aws`."""
    return name.split("/", 1)[0]


def run_connection(run: RunRecord) -> str:
    """The connection a run's current candidate runs on (runs made before names: the provider's default)."""
    return run.connection or run.provider


def candidates_of(run: RunRecord) -> list[RunCandidate]:
    """Every candidate in order: the stored list, or the run's single provider/offer."""
    return list(run.candidates) or [RunCandidate(connection=run_connection(run), offer=run.offer)]


def remaining(run: RunRecord) -> list[RunCandidate]:
    """The current candidate and the ones after it."""
    every = candidates_of(run)
    return every[min(run.candidate_index, len(every) - 1):]


def dearest_price(run: RunRecord) -> float:
    """The hourly price of the dearest candidate still ahead (the current one included): what price
    checks, forecasts and budgets hold the run to, since the launch may end on any of them."""
    return max(c.offer.total_per_hour for c in remaining(run))


def dearest_offer(run: RunRecord) -> GpuOffer:
    return max((c.offer for c in remaining(run)), key=lambda o: o.total_per_hour)


def attempt_no(run: RunRecord) -> int:
    """The attempt whose marks the run's machine carries: the launched (or failed) attempt's, else the one in flight
    (the next index). Written ahead of any cloud call: an attempt's index is the count of attempts decided
    before it, stored on the run in the same write that decided the previous one."""
    if run.attempts and run.attempts[-1].outcome in ("launched", "failed"):
        # The machine's attempt, or the one whose configuration error ended the run: its release looks there.
        return run.attempts[-1].index
    return len(run.attempts)


def view_of(c: RunCandidate) -> CandidateView:
    return CandidateView(connection=c.connection, provider=c.offer.provider, offer_id=c.offer.offer_id,
                         gpu=c.offer.gpu, total_per_hour=c.offer.total_per_hour)


def ran_on(run: RunRecord) -> CandidateView | None:
    """The candidate the run's machine was made on (the launched attempt's), or None."""
    launched = [a for a in run.attempts if a.outcome == "launched"]
    if not launched:
        return None
    a = launched[-1]
    return CandidateView(connection=a.connection, provider=a.provider, offer_id=a.offer_id, gpu=a.gpu,
                         total_per_hour=a.price_per_hour)


def with_candidate(run: RunRecord, index: int) -> dict[str, object]:
    """The fields that make candidate `index` the run's current one."""
    c = candidates_of(run)[index]
    default = c.connection == c.offer.provider
    return {"candidate_index": index, "provider": c.offer.provider, "offer": c.offer,
            "connection": "" if default else c.connection}


def abandoned(run: RunRecord, attempt: int) -> bool:
    """Whether a resource marked with `attempt` belongs to an attempt the run has given up (refused or
    failed): nothing of the run's steps will release it, the sweeper does."""
    return attempt < len(run.attempts) and run.attempts[attempt].outcome != "launched"


def attempt_lines(attempts: list[RunAttempt]) -> str:
    """One line per attempt, for a run that failed after every candidate refused."""
    return "\n".join(f"attempt {a.index + 1}: {a.connection} {a.offer_id} ({a.gpu}, {a.price_per_hour:g}/h): "
                     f"{a.outcome} {a.code}: {a.message}".rstrip(": ") for a in attempts)
