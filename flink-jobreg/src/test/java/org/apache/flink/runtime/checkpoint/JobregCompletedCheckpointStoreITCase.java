/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.apache.flink.runtime.checkpoint;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.core.execution.RecoveryClaimMode;
import org.apache.flink.runtime.state.RetrievableStateHandle;
import org.apache.flink.runtime.state.RetrievableStreamStateHandle;
import org.apache.flink.runtime.state.SharedStateRegistry;
import org.apache.flink.util.FlinkException;
import org.apache.flink.util.concurrent.Executors;

import org.jobreg.flink.JobregBrokerExtension;
import org.jobreg.flink.JobregCheckpointRecoveryFactory;
import org.jobreg.flink.JobregStateHandleStore;
import org.jobreg.flink.JobregStoreUtils;
import org.jobreg.flink.JobregTestUtils;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.stream.Collectors;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

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

    /** Adds checkpoints {@code from..to} to {@code store}, as Flink's coordinator does. */
    private static void add(CompletedCheckpointStore store, long from, long to) throws Exception {
        SharedStateRegistry registry = store.getSharedStateRegistry();
        for (long id = from; id <= to; id++) {
            store.addCheckpointAndSubsumeOldestOne(
                    createCheckpoint(id, registry), new CheckpointsCleaner(), () -> {});
        }
    }

    private static List<Long> ids(CompletedCheckpointStore store) throws Exception {
        return store.getAllCheckpoints().stream()
                .map(CompletedCheckpoint::getCheckpointID)
                .collect(Collectors.toList());
    }

    /**
     * A new store of the same job (a new leader) recovers what the old one held: the newest
     * {@code state.checkpoints.num-retained} completed checkpoints, at N = 1 and N = 3 (each
     * completion's record carries the count its store was built with; jobreg's fold keeps that
     * many, across failover and compaction).
     */
    @ParameterizedTest(name = "num-retained {0}")
    @ValueSource(ints = {1, 3})
    void testRecoverTheRetainedCheckpointsOfTheJob(int retained) throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        Executor executor = Executors.directExecutor();
        CompletedCheckpointStore store = create(jobId, retained, executor);
        add(store, 1, 5);
        List<Long> held = ids(store);
        assertThat(held).hasSize(retained).last().isEqualTo(5L);

        CompletedCheckpointStore recovered = create(jobId, retained, executor);
        assertThat(ids(recovered)).isEqualTo(held);
        assertThat(recovered.getLatestCheckpointId()).isEqualTo(5L);
        recovered.shutdown(JobStatus.CANCELED, new CheckpointsCleaner());
    }

    /**
     * The count is the store's, and can change between runs of a job: the three a store of N = 3
     * held are all recovered by one of N = 1 (Flink's store keeps what it recovers until its
     * next add), and its next add leaves only the newest, which is what the next leader gets.
     */
    @Test
    void testTheCountOfTheStoreThatAddedDecides() throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        Executor executor = Executors.directExecutor();
        add(create(jobId, 3, executor), 1, 3);

        CompletedCheckpointStore one = create(jobId, 1, executor);
        assertThat(ids(one)).containsExactly(1L, 2L, 3L);
        add(one, 4, 4);
        assertThat(ids(one)).containsExactly(4L);
        assertThat(ids(create(jobId, 1, executor))).containsExactly(4L);
    }

    /**
     * As Flink's own store (FLINK-22502, {@code
     * DefaultCompletedCheckpointStoreTest#testCorruptDataInStateHandleStoreShouldNotBeSkipped}):
     * a retained checkpoint whose metadata cannot be read fails the recovery; the older ones are
     * not restored in its place (that would silently roll the job's state back).
     */
    @Test
    void testAnUnreadableNewestCheckpointIsNotSkipped() throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        Executor executor = Executors.directExecutor();
        add(create(jobId, 3, executor), 1, 3);
        JobregStateHandleStore<CompletedCheckpoint> pointers =
                new JobregStateHandleStore<>(
                        leader.bridge,
                        JobregCheckpointRecoveryFactory.checkpointStoreName(jobId),
                        null);
        String newest = null;
        for (Tuple2<RetrievableStateHandle<CompletedCheckpoint>, String> entry :
                pointers.getAllAndLock()) {
            if (JobregStoreUtils.CHECKPOINTS.nameToCheckpointID(entry.f1) == 3L) {
                newest =
                        ((RetrievableStreamStateHandle<CompletedCheckpoint>) entry.f0)
                                .maybeGetPath()
                                .orElseThrow()
                                .getPath();
            }
        }
        assertThat(newest).isNotNull();
        Files.write(Paths.get(newest), new byte[] {1, 2, 3});

        assertThatThrownBy(() -> create(jobId, 3, executor))
                .isInstanceOf(FlinkException.class)
                .hasMessageContaining("Could not retrieve checkpoint 3");
    }
}
