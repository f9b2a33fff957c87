"""How ``checkpoint_reasons_before_2_3.avro`` (and its ``.json``) were made: run with jobreg at
commit dd79e61, before issue 29 moved the checkpoint failure table to Flink 2.3.0's, when
``FINALIZE_CHECKPOINT_FAILURE`` did not count and ``UNSPECIFIED`` did. The ``.json`` is what
that jobreg folded the dump to; ``test_a_log_written_before_flink_2_3_folds_to_the_same_answer``
holds every later jobreg to it. Run again, it writes what the jobreg at hand writes, so the
committed files are not to be regenerated.

    python tests/support/cases/make_checkpoint_reasons_before_2_3.py OUT.avro
"""

import json
import sys
from pathlib import Path

from registry import EmbeddedBroker, Registry
from registry.events import CHECKPOINT_FAILURE_REASONS
from registry.forensics import BrokerSource, DumpSource, Forensics


def main(out: Path) -> None:
    """Write the log through the client on an embedded broker, dump it, and note its fold."""
    with EmbeddedBroker() as b:
        reg = Registry.connect(b.bootstrap, "flink", topic="old-log",
                               blob_store=out.parent / "blobs")
        t = reg.claim_leadership("jm-1")
        # testTotalCountValue as this jobreg wrote it: tolerable 0, one trigger failure per
        # reason, the job restarted each time it is over budget.
        t.submit("job-total", b"g", max_checkpoint_failures=0)
        for name in CHECKPOINT_FAILURE_REASONS:
            t.checkpoint_trigger_failed("job-total", name, f"trigger failed: {name}")
            if reg.job("job-total").over_budget:
                t.job_restarted("job-total", "over budget")
        # FINALIZE_CHECKPOINT_FAILURE did not count; the others leave the job over budget.
        t.submit("job-finalize", b"g", max_checkpoint_failures=1)
        t.checkpoint_triggered("job-finalize", 1)
        t.checkpoint_failed("job-finalize", 1, "finalize",
                            failure_reason="FINALIZE_CHECKPOINT_FAILURE")
        t.checkpoint_triggered("job-finalize", 2)
        t.checkpoint_failed("job-finalize", 2, "declined", "map-1",
                            failure_reason="CHECKPOINT_DECLINED")
        t.checkpoint_trigger_failed("job-finalize", "FINALIZE_CHECKPOINT_FAILURE", "finalize")
        t.checkpoint_triggered("job-finalize", 3)
        t.checkpoint_failed("job-finalize", 3, "no reason given")  # UNSPECIFIED: counted
        # Within budget only because FINALIZE_CHECKPOINT_FAILURE did not count.
        t.submit("job-within", b"g", max_checkpoint_failures=1)
        t.checkpoint_triggered("job-within", 1)
        t.checkpoint_completed("job-within", 1, "s3://cp/1")
        t.checkpoint_triggered("job-within", 2)
        t.checkpoint_failed("job-within", 2, "finalize",
                            failure_reason="FINALIZE_CHECKPOINT_FAILURE")
        t.checkpoint_triggered("job-within", 3)
        t.checkpoint_failed("job-within", 3, "expired", failure_reason="CHECKPOINT_EXPIRED")
        t.checkpoint_trigger_failed("job-within", "FINALIZE_CHECKPOINT_FAILURE", "finalize")
        Forensics(BrokerSource(b.bootstrap, "old-log", reg.partition), "flink").dump(
            out, topic="old-log")
        reg.close()
    scan = Forensics(DumpSource(out), "flink").scan()
    expected = {
        "jobs": {j: {"over_budget": v.over_budget,
                     "consecutive_failures": v.checkpoints.consecutive_failures,
                     "counted": list(v.checkpoints.counted),
                     "unknown_failures": v.checkpoints.unknown_failures,
                     "last_completed": v.checkpoints.last_completed,
                     "pending": list(v.checkpoints.pending)}
                 for j, v in sorted(scan.image.jobs.items())},
        "decisions": [[d.offset, d.event_type, str(d.outcome), d.reason, d.detail]
                      for d in scan.decisions],
    }
    out.with_suffix(".json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
