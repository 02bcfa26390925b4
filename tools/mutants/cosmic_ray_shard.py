"""Skip every pending cosmic-ray mutant outside shard K of N, for `make mutants`' rotation
(tools/mutants/run.py). The mutants are dealt round robin in source order (file, position,
operator), so each shard takes a share of every module and N runs with K = 0 .. N-1 test each
mutant once.

    python cosmic_ray_shard.py SESSION K N

Run with cosmic-ray's own Python (its environment holds the session's classes).
"""

from __future__ import annotations

import sys

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


def main() -> int:
    session, shard, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with use_db(session, WorkDB.Mode.open) as db:
        items = sorted(
            db.pending_work_items,
            key=lambda item: [
                (str(m.module_path), tuple(m.start_pos), m.operator_name, m.occurrence)
                for m in item.mutations
            ],
        )
        for index, item in enumerate(items):
            if index % count != shard:
                db.set_result(
                    item.job_id,
                    WorkResult(output="another shard", worker_outcome=WorkerOutcome.SKIPPED),
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
