/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.checkpoint.CheckpointsCleaner;
import org.apache.flink.runtime.checkpoint.CompletedCheckpoint;
import org.apache.flink.runtime.checkpoint.CompletedCheckpointStore;
import org.apache.flink.runtime.state.SharedStateRegistry;

import java.util.List;

/**
 * Flink's {@code DefaultCompletedCheckpointStore} (over a {@link JobregStateHandleStore}) that,
 * when shut down with a globally terminal status, first records the job's end in jobreg (see
 * {@link JobregJobTerminal}: in Flink 2.3 this runs after the Dispatcher's dirty job result; the
 * earlier record comes from {@link JobregJobStatusChangedListenerFactory}).
 */
public class JobregCompletedCheckpointStore implements CompletedCheckpointStore {

    private final CompletedCheckpointStore delegate;
    private final JobregBridge bridge;
    private final JobID jobId;

    public JobregCompletedCheckpointStore(
            CompletedCheckpointStore delegate, JobregBridge bridge, JobID jobId) {
        this.delegate = delegate;
        this.bridge = bridge;
        this.jobId = jobId;
    }

    @Override
    public CompletedCheckpoint addCheckpointAndSubsumeOldestOne(
            CompletedCheckpoint checkpoint,
            CheckpointsCleaner checkpointsCleaner,
            Runnable postCleanup)
            throws Exception {
        return delegate.addCheckpointAndSubsumeOldestOne(
                checkpoint, checkpointsCleaner, postCleanup);
    }

    @Override
    public CompletedCheckpoint getLatestCheckpoint() {
        return delegate.getLatestCheckpoint();
    }

    @Override
    public long getLatestCheckpointId() {
        return delegate.getLatestCheckpointId();
    }

    @Override
    public void shutdown(JobStatus jobStatus, CheckpointsCleaner checkpointsCleaner)
            throws Exception {
        if (jobStatus.isGloballyTerminalState()) {
            JobregJobTerminal.record(bridge, jobId, jobStatus);
        }
        delegate.shutdown(jobStatus, checkpointsCleaner);
    }

    @Override
    public List<CompletedCheckpoint> getAllCheckpoints() {
        return delegate.getAllCheckpoints();
    }

    @Override
    public int getNumberOfRetainedCheckpoints() {
        return delegate.getNumberOfRetainedCheckpoints();
    }

    @Override
    public int getMaxNumberOfRetainedCheckpoints() {
        return delegate.getMaxNumberOfRetainedCheckpoints();
    }

    @Override
    public boolean requiresExternalizedCheckpoints() {
        return delegate.requiresExternalizedCheckpoints();
    }

    @Override
    public SharedStateRegistry getSharedStateRegistry() {
        return delegate.getSharedStateRegistry();
    }
}
