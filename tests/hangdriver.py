"""A run whose step hangs, as a subprocess: the step deadline of an in-process publisher.

    python tests/hangdriver.py --base DIR --ttl S --step-timeout S [--linger S]

Takes the job lock as ``commitpub run`` does (``jobs.runs.locking``: acquire, fence, renew in
the background; the lock lives beside the commit store ``<base>/steps``), writes
``<base>/took-<token>`` once it holds it, recovers, then publishes the dataset ``hung``:
one :class:`hangsteps.GateStep` that blocks until ``<base>/gate`` exists and then appends to
``<base>/output/hung/lines``. Exits 0 when everything was published or recovered. A step
abandoned at its deadline prints ``hangdriver: abandoned: ...`` on stderr, writes
``<base>/abandoned``, stays alive ``--linger`` seconds (as a process that goes on with other
work would: its lease must not be renewed meanwhile), and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import hangsteps

from jobs.runs.locking import fence, held_lock
from publisher import DeadlineError, Publisher
from store.errors import FencedError, LockHeldError

JOB = "hang-job"
DATASET = "hung"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--step-timeout", type=float, required=True)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    base = Path(args.base)
    store = str(base / "steps")
    try:
        with held_lock(JOB, store, args.ttl) as keeper:
            (base / f"took-{keeper.lease.token}").touch()
            pub = Publisher(
                store,
                JOB,
                staging_roots=[str(base / "staging")],
                output_roots=[str(base / "output")],
                fencing_token=keeper.lease.token,
                lease=keeper,
                step_timeout_s=args.step_timeout,
            )
            try:
                fence(pub, keeper)
                recovery = pub.recover()
                outcomes = {d.dataset: str(d.outcome) for d in recovery.datasets}
                if not recovery.datasets:
                    step = hangsteps.GateStep(
                        str(base / "gate"), str(base / "output" / DATASET / "lines"), "once"
                    )
                    report = pub.publish({DATASET: [step]})
                    outcomes.update({d.dataset: str(d.outcome) for d in report.datasets})
            except DeadlineError as e:
                print(f"hangdriver: abandoned: {e}", file=sys.stderr, flush=True)
                (base / "abandoned").touch()
                time.sleep(args.linger)
                return 1
            finally:
                pub.close()
    except (LockHeldError, FencedError) as e:
        print(f"hangdriver: {e}", file=sys.stderr)
        return 75
    print(json.dumps(outcomes))
    return 0 if set(outcomes.values()) <= {"published", "recovered"} else 1


if __name__ == "__main__":
    sys.exit(main())
