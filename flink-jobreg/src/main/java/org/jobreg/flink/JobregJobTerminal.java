/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Records a job's globally terminal status in jobreg ({@code job_terminal}; idempotent). Called
 * first by {@link JobregJobStatusChangedListenerFactory}'s listener, synchronously inside the
 * execution graph's transition to the terminal state, before the Dispatcher learns of it and
 * writes its dirty job result: a JobManager killed in between leaves a registry that already
 * knows the job ended, so the next leader does not run a cancelled job again (seed 001). Called
 * again from the checkpoint services' shutdown ({@link JobregCompletedCheckpointStore}, {@link
 * JobregCheckpointIDCounter}), which in Flink 2.3 runs only when the scheduler closes, after the
 * Dispatcher's write, and for jobs with checkpointing only.
 */
final class JobregJobTerminal {

    private static final Logger LOG = LoggerFactory.getLogger(JobregJobTerminal.class);

    private JobregJobTerminal() {}

    static void record(JobregBridge bridge, JobID jobId, JobStatus status) {
        ObjectNode request = JobregBridge.request("job_terminal");
        request.put("job", jobId.toHexString());
        request.put("status", status.name());
        try {
            bridge.callUninterruptibly(request);
            LOG.info("Recorded in jobreg that job {} reached {}.", jobId, status);
        } catch (JobregBridgeException e) {
            // Not fatal: the Dispatcher's dirty job result records the end too, a moment later.
            LOG.warn(
                    "Could not record in jobreg that job {} reached {}: {}",
                    jobId,
                    status,
                    e.getMessage());
        }
    }
}
