/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.apache.flink.runtime.checkpoint;

import org.apache.flink.api.common.JobID;

import org.jobreg.flink.JobregBrokerExtension;
import org.jobreg.flink.JobregCheckpointIDCounter;
import org.jobreg.flink.JobregTestUtils;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;

/**
 * Flink's {@link CheckpointIDCounterTestBase} against {@link JobregCheckpointIDCounter}. The base
 * class is package-private, hence this package. Each counter belongs to a fresh job that the
 * leading bridge submitted first (jobreg counts checkpoints of known jobs).
 */
class JobregCheckpointIDCounterITCase extends CheckpointIDCounterTestBase {

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

    @Override
    protected CheckpointIDCounter createCheckpointIdCounter() throws Exception {
        JobID jobId = new JobID();
        JobregTestUtils.submitJob(leader.bridge, jobId);
        return new JobregCheckpointIDCounter(leader.bridge, jobId);
    }
}
