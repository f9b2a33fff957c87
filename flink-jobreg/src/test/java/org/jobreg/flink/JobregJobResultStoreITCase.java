/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.highavailability.JobResultEntry;
import org.apache.flink.runtime.highavailability.JobResultStore;
import org.apache.flink.runtime.highavailability.JobResultStoreContractTest;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.util.concurrent.Executors;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Flink's {@link JobResultStoreContractTest} against {@link JobregJobResultStore}: each test gets
 * a fresh namespace (the contract's dummy entry has a fixed JobID) and a bridge that leads it.
 */
class JobregJobResultStoreITCase implements JobResultStoreContractTest {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    @TempDir Path storageDir;

    private final List<JobregTestUtils.Leader> leaders = new ArrayList<>();

    @Override
    public JobResultStore createJobResultStore() throws IOException {
        try {
            JobregTestUtils.Leader leader =
                    JobregTestUtils.startLeader(
                            JobregTestUtils.configuration(
                                    BROKER.getBootstrap(),
                                    JobregTestUtils.freshClusterId(),
                                    storageDir));
            leaders.add(leader);
            return new JobregJobResultStore(leader.bridge, Executors.directExecutor());
        } catch (Exception e) {
            throw new IOException(e);
        }
    }

    @AfterEach
    void closeLeaders() throws Exception {
        for (JobregTestUtils.Leader leader : leaders) {
            leader.close();
        }
        leaders.clear();
    }

    /** Seed 001: a job whose end {@code job_terminal} recorded already has a dirty result. */
    @Test
    void testJobTerminalMakesADirtyResult() throws Exception {
        JobResultStore store = createJobResultStore();
        JobregBridge bridge = leaders.get(0).bridge;
        JobID jobId = new JobID();
        JobregJobTerminal.record(bridge, jobId, JobStatus.CANCELED);

        assertThat(store.hasDirtyJobResultEntryAsync(jobId).join()).isTrue();
        assertThat(store.getDirtyResults())
                .singleElement()
                .satisfies(
                        result -> {
                            assertThat(result.getJobId()).isEqualTo(jobId);
                            assertThat(result.getJobStatus()).contains(JobStatus.CANCELED);
                        });
        assertThatThrownBy(
                        () ->
                                store.createDirtyResultAsync(
                                                new JobResultEntry(
                                                        new JobResult.Builder()
                                                                .jobId(jobId)
                                                                .jobStatus(JobStatus.CANCELED)
                                                                .netRuntime(1)
                                                                .build()))
                                        .join())
                .hasRootCauseInstanceOf(IllegalStateException.class);
        store.markResultAsCleanAsync(jobId).join();
        assertThat(store.hasCleanJobResultEntryAsync(jobId).join()).isTrue();
    }
}
