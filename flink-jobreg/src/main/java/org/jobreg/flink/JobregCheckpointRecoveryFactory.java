/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.execution.RecoveryClaimMode;
import org.apache.flink.runtime.checkpoint.CheckpointIDCounter;
import org.apache.flink.runtime.checkpoint.CheckpointRecoveryFactory;
import org.apache.flink.runtime.checkpoint.CompletedCheckpoint;
import org.apache.flink.runtime.checkpoint.CompletedCheckpointStore;
import org.apache.flink.runtime.checkpoint.DefaultCompletedCheckpointStore;
import org.apache.flink.runtime.checkpoint.DefaultCompletedCheckpointStoreUtils;
import org.apache.flink.runtime.persistence.RetrievableStateStorageHelper;
import org.apache.flink.runtime.state.SharedStateRegistryFactory;
import org.apache.flink.runtime.util.ZooKeeperUtils;

import java.util.Collection;
import java.util.concurrent.Executor;

/**
 * Completed-checkpoint stores and checkpoint ID counters over jobreg, built as Flink's {@code
 * ZooKeeperUtils.createCompletedCheckpoints} builds ZooKeeper's: checkpoint metadata in files under
 * {@code high-availability.storageDir}, their pointers in jobreg's {@code checkpoints/<job>}
 * store, Flink's {@link DefaultCompletedCheckpointStore} on top. Each completed checkpoint's
 * record carries the count the store keeps ({@code state.checkpoints.num-retained}), so the
 * newest that many are what the next leader recovers, as Flink's store held them.
 */
public class JobregCheckpointRecoveryFactory implements CheckpointRecoveryFactory {

    private final JobregBridge bridge;
    private final Configuration configuration;
    private final Executor executor;

    public JobregCheckpointRecoveryFactory(
            JobregBridge bridge, Configuration configuration, Executor executor) {
        this.bridge = bridge;
        this.configuration = configuration;
        this.executor = executor;
    }

    @Override
    public CompletedCheckpointStore createRecoveredCompletedCheckpointStore(
            JobID jobId,
            int maxNumberOfCheckpointsToRetain,
            SharedStateRegistryFactory sharedStateRegistryFactory,
            Executor ioExecutor,
            RecoveryClaimMode recoveryClaimMode)
            throws Exception {
        RetrievableStateStorageHelper<CompletedCheckpoint> storage =
                ZooKeeperUtils.createFileSystemStateStorage(
                        configuration, ZooKeeperUtils.HA_STORAGE_COMPLETED_CHECKPOINT);
        JobregStateHandleStore<CompletedCheckpoint> store =
                new JobregStateHandleStore<>(
                        bridge, checkpointStoreName(jobId), storage, maxNumberOfCheckpointsToRetain);
        Collection<CompletedCheckpoint> checkpoints =
                DefaultCompletedCheckpointStoreUtils.retrieveCompletedCheckpoints(
                        store, JobregStoreUtils.CHECKPOINTS);
        DefaultCompletedCheckpointStore<?> defaultStore =
                new DefaultCompletedCheckpointStore<>(
                        maxNumberOfCheckpointsToRetain,
                        store,
                        JobregStoreUtils.CHECKPOINTS,
                        checkpoints,
                        sharedStateRegistryFactory.create(
                                ioExecutor, checkpoints, recoveryClaimMode),
                        executor);
        return new JobregCompletedCheckpointStore(defaultStore, bridge, jobId);
    }

    @Override
    public CheckpointIDCounter createCheckpointIDCounter(JobID jobId) {
        return new JobregCheckpointIDCounter(bridge, jobId);
    }

    /** The jobreg store that holds one job's checkpoint pointers. */
    public static String checkpointStoreName(JobID jobId) {
        return "checkpoints/" + jobId.toHexString();
    }
}
