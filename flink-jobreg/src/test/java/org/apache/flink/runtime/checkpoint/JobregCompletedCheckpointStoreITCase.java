/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.apache.flink.runtime.checkpoint;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.core.execution.RecoveryClaimMode;
import org.apache.flink.runtime.state.SharedStateRegistry;
import org.apache.flink.util.concurrent.Executors;

import org.jobreg.flink.JobregBrokerExtension;
import org.jobreg.flink.JobregCheckpointRecoveryFactory;
import org.jobreg.flink.JobregTestUtils;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.concurrent.Executor;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Flink's {@link CompletedCheckpointStoreTest} against jobreg's completed-checkpoint store
 * ({@link JobregCheckpointRecoveryFactory}: Flink's DefaultCompletedCheckpointStore over a
 * JobregStateHandleStore, metadata files under the storage dir, pointers in jobreg). The base
 * class is package-private, hence this package.
 */
class JobregCompletedCheckpointStoreITCase extends CompletedCheckpointStoreTest {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    @TempDir static Path storageDir;

    private static JobregTestUtils.Leader leader;

    @BeforeAll
    static void startLeader() throws Exception {
        leader =
                JobregTestUtils.startLeader(
                        JobregTestUtils.configuration(
                                BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir));
    }

    @AfterAll
    static void stopLeader() throws Exception {
        if (leader != null) {
            leader.close();
        }
    }

    private JobregCheckpointRecoveryFactory factory(Executor executor) {
        return new JobregCheckpointRecoveryFactory(
                leader.bridge,
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), leader.bridge.getNamespace(), storageDir),
                executor);
    }

    @Override
    protected CompletedCheckpointStore createRecoveredCompletedCheckpointStore(
            int maxNumberOfCheckpointsToRetain, Executor executor) throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        return create(jobId, maxNumberOfCheckpointsToRetain, executor);
    }

    private CompletedCheckpointStore create(JobID jobId, int maxRetained, Executor executor)
            throws Exception {
        return factory(executor)
                .createRecoveredCompletedCheckpointStore(
                        jobId,
                        maxRetained,
                        SharedStateRegistry.DEFAULT_FACTORY,
                        executor,
                        RecoveryClaimMode.DEFAULT);
    }

    /**
     * A new store of the same job (a new leader) recovers the newest checkpoint from jobreg. The
     * fold retains a job's newest {@code retained_checkpoints} completions (the bridge submits
     * plans with jobreg's default, 1), so the older ones are not recovered although this store
     * keeps 3 in memory.
     */
    @Test
    void testRecoverCheckpointsOfTheJob() throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        Executor executor = Executors.directExecutor();
        CompletedCheckpointStore store = create(jobId, 3, executor);
        SharedStateRegistry registry = store.getSharedStateRegistry();
        for (long id = 1; id <= 3; id++) {
            store.addCheckpointAndSubsumeOldestOne(
                    createCheckpoint(id, registry), new CheckpointsCleaner(), () -> {});
        }

        CompletedCheckpointStore recovered = create(jobId, 3, executor);
        assertThat(recovered.getAllCheckpoints())
                .extracting(CompletedCheckpoint::getCheckpointID)
                .containsExactly(3L);
        assertThat(recovered.getLatestCheckpointId()).isEqualTo(3L);
        recovered.shutdown(JobStatus.CANCELED, new CheckpointsCleaner());
    }
}
