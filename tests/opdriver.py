"""The operator's commands on the job of ``crashdriver.py``, run as a subprocess.

    python tests/opdriver.py discard --base DIR --store URL --watermarks URL --dataset D
    python tests/opdriver.py retry   --base DIR --store URL --watermarks URL --dataset D

Same job name and roots as ``crashdriver.py``, so a test can crash a run with one, act on
what it left with the other, and finish with the first. Crashes come from
``COMMITPUB_FAILPOINTS`` (store/failpoints.py). Prints what the command returned as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from publisher import Publisher, RetryPolicy
from publisher.converter import to_json

JOB = "crash-job"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["discard", "retry"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--watermarks", required=True)
    parser.add_argument("--dataset", required=True)
    args = parser.parse_args(argv)
    pub = Publisher(
        args.store,
        JOB,
        staging_roots=[f"{args.base}/staging"],
        output_roots=[f"{args.base}/output"],
        retry=RetryPolicy(attempts=2, initial_wait_s=0.01, max_wait_s=0.05),
        stores=[args.watermarks],
    )
    out: object
    if args.command == "discard":
        out = to_json(pub.discard(args.dataset))
    else:
        out = {"was_quarantined": pub.retry(args.dataset)}
    pub.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
