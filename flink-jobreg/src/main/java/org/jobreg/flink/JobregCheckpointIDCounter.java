/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.checkpoint.CheckpointIDCounter;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import java.util.concurrent.CompletableFuture;

/**
 * {@link CheckpointIDCounter} kept in jobreg's log, per job. Its {@link #shutdown} with a
 * globally terminal status records the job's end in the registry at once ({@code job_terminal}),
 * before Flink's Dispatcher writes its dirty job result.
 */
public class JobregCheckpointIDCounter implements CheckpointIDCounter {

    private final JobregBridge bridge;
    private final JobID jobId;

    public JobregCheckpointIDCounter(JobregBridge bridge, JobID jobId) {
        this.bridge = bridge;
        this.jobId = jobId;
    }

    private ObjectNode request(String op) {
        ObjectNode request = JobregBridge.request(op);
        request.put("job", jobId.toHexString());
        return request;
    }

    @Override
    public void start() {}

    @Override
    public CompletableFuture<Void> shutdown(JobStatus jobStatus) {
        if (jobStatus.isGloballyTerminalState()) {
            JobregJobTerminal.record(bridge, jobId, jobStatus);
        }
        return CompletableFuture.completedFuture(null);
    }

    @Override
    public long getAndIncrement() throws Exception {
        return bridge.call(request("counter_next")).path("value").asLong();
    }

    @Override
    public long get() {
        try {
            return bridge.callUninterruptibly(request("counter_get")).path("value").asLong();
        } catch (JobregBridgeException e) {
            throw new IllegalStateException("Cannot read the checkpoint ID counter of " + jobId, e);
        }
    }

    @Override
    public void setCount(long newId) throws Exception {
        ObjectNode request = request("counter_set");
        request.put("value", newId);
        bridge.call(request);
    }
}
