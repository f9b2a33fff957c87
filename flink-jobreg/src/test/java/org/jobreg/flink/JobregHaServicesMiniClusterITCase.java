/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.JobManagerOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.runtime.client.JobStatusMessage;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.graph.StreamGraph;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A MiniCluster on jobreg ({@code high-availability.type} = {@link JobregHaServicesFactory}), after
 * Flink's {@code UpdateJobResourceRequirementsRecoveryITCase}: a streaming job with checkpoints
 * is submitted, the cluster closes without cleaning its high-availability data (a JobManager
 * crash), and a new MiniCluster with the same configuration recovers the job from jobreg, from
 * its last checkpoint. A job cancelled before the crash does not come back (FLINK-11115,
 * FLINK-10255, seeds 000/001).
 */
@Timeout(value = 240, unit = TimeUnit.SECONDS)
class JobregHaServicesMiniClusterITCase {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    private static final Duration TIMEOUT = Duration.ofSeconds(120);

    @TempDir Path storageDir;

    private Configuration configuration;
    private JobregBridge observer;
    private final List<MiniCluster> clusters = new ArrayList<>();

    @BeforeEach
    void setUp() throws Exception {
        configuration =
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir);
        // The job must survive its TaskManager's disconnect when the first cluster goes away.
        configuration.set(RestartStrategyOptions.RESTART_STRATEGY, "fixed-delay");
        configuration.set(
                RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_ATTEMPTS, Integer.MAX_VALUE);
        configuration.set(
                RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_DELAY, Duration.ofMillis(200));
        // Loopback only, and no fixed port (other JobManagers may run on this machine).
        configuration.set(RestOptions.BIND_PORT, "0");
        configuration.set(RestOptions.BIND_ADDRESS, "127.0.0.1");
        configuration.set(RestOptions.ADDRESS, "127.0.0.1");
        configuration.set(JobManagerOptions.BIND_HOST, "127.0.0.1");
        configuration.set(TaskManagerOptions.BIND_HOST, "127.0.0.1");
        // A bridge that never contends: it reads what the clusters wrote.
        observer = JobregBridge.start(configuration);
    }

    @AfterEach
    void tearDown() throws Exception {
        for (MiniCluster cluster : clusters) {
            if (cluster.isRunning()) {
                cluster.closeAsync().get(60, TimeUnit.SECONDS);
            }
        }
        observer.close();
    }

    private MiniCluster startCluster() throws Exception {
        MiniCluster cluster =
                new MiniCluster(
                        new MiniClusterConfiguration.Builder()
                                .setConfiguration(new Configuration(configuration))
                                .setNumTaskManagers(1)
                                .setNumSlotsPerTaskManager(1)
                                .build());
        clusters.add(cluster);
        cluster.start();
        return cluster;
    }

    /** A slow endless source into a discarding sink, checkpointed every 200 ms. */
    private static StreamGraph streamingJob() {
        StreamExecutionEnvironment env = new StreamExecutionEnvironment(new Configuration());
        env.setParallelism(1);
        env.enableCheckpointing(200);
        env.fromSequence(0, Long.MAX_VALUE)
                .map(new JobregTestUtils.Throttle())
                .sinkTo(new DiscardingSink<>());
        StreamGraph graph = env.getStreamGraph();
        graph.setJobId(new JobID());
        return graph;
    }

    @Test
    void testJobRecoversFromJobregAfterACrash() throws Exception {
        MiniCluster first = startCluster();
        StreamGraph job = streamingJob();
        JobID jobId = job.getJobID();
        first.submitJob(job).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        awaitStatus(first, jobId, JobStatus.RUNNING);
        // The execution plan's pointer and a completed checkpoint's are in jobreg.
        assertThat(names("plans")).contains(jobId.toHexString());
        awaitCondition(() -> !checkpoints(jobId).isEmpty(), "a completed checkpoint in jobreg");

        first.closeAsyncWithoutCleaningHighAvailabilityData()
                .get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);

        MiniCluster second = startCluster();
        awaitStatus(second, jobId, JobStatus.RUNNING);
        awaitCondition(
                () ->
                        second.getExecutionGraph(jobId)
                                        .get()
                                        .getCheckpointStatsSnapshot()
                                        .getLatestRestoredCheckpoint()
                                != null,
                "the recovered job restored a checkpoint");

        second.cancelJob(jobId).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        JobResult result =
                second.requestJobResult(jobId).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        assertThat(result.getJobStatus()).contains(JobStatus.CANCELED);
    }

    @Test
    void testCancelledJobDoesNotComeBack() throws Exception {
        MiniCluster first = startCluster();
        StreamGraph job = streamingJob();
        JobID jobId = job.getJobID();
        first.submitJob(job).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        awaitStatus(first, jobId, JobStatus.RUNNING);

        first.cancelJob(jobId).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        assertThat(first.requestJobResult(jobId).get(TIMEOUT.toSeconds(), TimeUnit.SECONDS)
                        .getJobStatus())
                .contains(JobStatus.CANCELED);
        first.closeAsyncWithoutCleaningHighAvailabilityData()
                .get(TIMEOUT.toSeconds(), TimeUnit.SECONDS);

        // jobreg knows the job ended: no live plan, a result (dirty or clean).
        assertThat(names("plans")).doesNotContain(jobId.toHexString());
        ObjectNode has = JobregBridge.request("result_has");
        has.put("job", jobId.toHexString());
        JsonNode result = observer.call(has);
        assertThat(result.path("dirty").asBoolean() || result.path("clean").asBoolean()).isTrue();

        MiniCluster second = startCluster();
        // Once the Dispatcher answers, it has recovered what jobreg gave it.
        Collection<JobStatusMessage> jobs =
                awaitValue(() -> second.listJobs().get(), "the second Dispatcher answers");
        assertThat(jobs)
                .filteredOn(message -> message.getJobId().equals(jobId))
                .allSatisfy(
                        message ->
                                assertThat(message.getJobState().isGloballyTerminalState())
                                        .isTrue());
        assertThat(names("plans")).doesNotContain(jobId.toHexString());
    }

    // ------------------------------------------------------------------------------------------

    private List<String> names(String store) throws Exception {
        ObjectNode request = JobregBridge.request("store_names");
        request.put("store", store);
        List<String> names = new ArrayList<>();
        observer.call(request).forEach(name -> names.add(name.asText()));
        return names;
    }

    private List<String> checkpoints(JobID jobId) throws Exception {
        return names(JobregCheckpointRecoveryFactory.checkpointStoreName(jobId));
    }

    private static void awaitStatus(MiniCluster cluster, JobID jobId, JobStatus status)
            throws Exception {
        awaitCondition(
                () -> cluster.getJobStatus(jobId).get() == status, "job " + jobId + " " + status);
    }

    private static void awaitCondition(Callable<Boolean> condition, String what)
            throws Exception {
        awaitValue(() -> condition.call() ? Boolean.TRUE : null, what);
    }

    private static <T> T awaitValue(Callable<T> value, String what) throws Exception {
        long deadline = System.nanoTime() + TIMEOUT.toNanos();
        Exception last = null;
        while (System.nanoTime() - deadline < 0) {
            try {
                T result = value.call();
                if (result != null) {
                    return result;
                }
            } catch (Exception e) {
                last = e; // Not there yet (e.g. the job is not recovered yet).
            }
            Thread.sleep(100);
        }
        throw new AssertionError("timed out waiting for " + what, last);
    }
}
