/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.blob.BlobUtils;
import org.apache.flink.runtime.highavailability.FileSystemApplicationResultStore;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.JobGraphTestUtils;
import org.apache.flink.runtime.jobgraph.JobResourceRequirements;
import org.apache.flink.runtime.jobgraph.JobVertex;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStore;
import org.apache.flink.runtime.testtasks.NoOpInvokable;
import org.apache.flink.util.concurrent.Executors;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Seed 003, deterministically: a plan whose file cannot be deserialized any more. The next
 * leader's {@link JobregExecutionPlanStore} records the job RECOVERY_FAILED in jobreg and returns
 * null for it (Flink's Dispatcher skips it), recovers the other job, and no longer lists the
 * broken one; a store whose bridge does not lead rethrows the failure.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobregExecutionPlanStoreITCase {

    @RegisterExtension static final JobregBrokerExtension BROKER = new JobregBrokerExtension();

    @TempDir Path storageDir;

    private Configuration configuration;
    private final Executor executor = Executors.directExecutor();
    private final List<AutoCloseable> resources = new ArrayList<>();

    @BeforeEach
    void setUp() {
        configuration =
                JobregTestUtils.configuration(
                        BROKER.getBootstrap(), JobregTestUtils.freshClusterId(), storageDir);
    }

    @AfterEach
    void tearDown() {
        for (int i = resources.size() - 1; i >= 0; i--) {
            try {
                resources.get(i).close();
            } catch (Exception e) {
                // A crashed member: nothing to close.
            }
        }
    }

    private JobregHaServices services(JobregBridge bridge) throws Exception {
        return new JobregHaServices(
                configuration,
                executor,
                BlobUtils.createBlobStoreFromConfig(configuration),
                bridge,
                FileSystemApplicationResultStore.fromConfiguration(configuration, executor));
    }

    private JobregHaServices leadingServices() throws Exception {
        JobregTestUtils.Leader leader = JobregTestUtils.startLeader(configuration);
        resources.add(leader);
        return services(leader.bridge);
    }

    private static ExecutionPlanStore started(ExecutionPlanStore store) throws Exception {
        store.start(
                new ExecutionPlanStore.ExecutionPlanListener() {
                    @Override
                    public void onAddedExecutionPlan(JobID jobId) {}

                    @Override
                    public void onRemovedExecutionPlan(JobID jobId) {}
                });
        return store;
    }

    private static JobGraph job() {
        JobVertex vertex = new JobVertex("v");
        vertex.setInvokableClass(NoOpInvokable.class);
        return JobGraphTestUtils.streamingJobGraph(vertex);
    }

    /** Overwrites the file that holds the job's plan (its pointer in jobreg). */
    private static void corrupt(JobregBridge bridge, JobID jobId) throws Exception {
        ObjectNode request = JobregBridge.request("store_get");
        request.put("store", JobregHaServices.PLANS);
        request.put("name", jobId.toHexString());
        String pointer = bridge.call(request).path("pointer").asText();
        Path file = pointer.contains(":") ? Paths.get(URI.create(pointer)) : Paths.get(pointer);
        Files.write(file, "not a serialized execution plan".getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void testAnUnreadablePlanFailsItsJobAloneOnTheNextLeader() throws Exception {
        JobregHaServices first = leadingServices();
        ExecutionPlanStore plans = started(first.getExecutionPlanStore());
        JobGraph broken = job();
        JobGraph healthy = job();
        plans.putExecutionPlan(broken);
        plans.putExecutionPlan(healthy);
        corrupt(first.getBridge(), broken.getJobID());
        // The leader dies; the next one recovers.
        ProcessHandle.of(first.getBridge().pid()).ifPresent(ProcessHandle::destroyForcibly);
        first.getBridge().closedFuture().get(30, TimeUnit.SECONDS);

        JobregHaServices next = leadingServices();
        ExecutionPlanStore recovering = started(next.getExecutionPlanStore());
        assertThat(recovering.getJobIds())
                .containsExactlyInAnyOrder(broken.getJobID(), healthy.getJobID());
        assertThat(recovering.recoverExecutionPlan(broken.getJobID())).isNull();
        assertThat(recovering.recoverExecutionPlan(healthy.getJobID()).getJobID())
                .isEqualTo(healthy.getJobID());
        // Recorded: the job is RECOVERY_FAILED and no longer listed for recovery.
        assertThat(recovering.getJobIds()).containsExactly(healthy.getJobID());
        assertThat(started(leadingServicesAfter(next).getExecutionPlanStore()).getJobIds())
                .containsExactly(healthy.getJobID());
    }

    /** Another leader after {@code previous}: its bridge killed first. */
    private JobregHaServices leadingServicesAfter(JobregHaServices previous) throws Exception {
        ProcessHandle.of(previous.getBridge().pid()).ifPresent(ProcessHandle::destroyForcibly);
        previous.getBridge().closedFuture().get(30, TimeUnit.SECONDS);
        return leadingServices();
    }

    /**
     * Issue 43 item 1: the adaptive scheduler's rescale ({@code putJobResourceRequirements}) is
     * a fenced record of its own in jobreg, not a replace of the stored plan; the next leader
     * recovers the plan with the newest requirements, a second rescale replacing the first. A
     * store whose bridge does not lead is refused and changes nothing.
     */
    @Test
    void testARescaleSurvivesTheLeadersDeathAndAStandbyCannotRescale() throws Exception {
        JobregHaServices first = leadingServices();
        ExecutionPlanStore plans = started(first.getExecutionPlanStore());
        JobVertex source = new JobVertex("source");
        source.setInvokableClass(NoOpInvokable.class);
        JobVertex sink = new JobVertex("sink");
        sink.setInvokableClass(NoOpInvokable.class);
        JobGraph graph = JobGraphTestUtils.streamingJobGraph(source, sink);
        plans.putExecutionPlan(graph);
        assertThat(JobResourceRequirements.readFromExecutionPlan(
                        plans.recoverExecutionPlan(graph.getJobID())))
                .isEmpty();
        plans.putJobResourceRequirements(
                graph.getJobID(),
                JobResourceRequirements.newBuilder()
                        .setParallelismForJobVertex(source.getID(), 1, 1)
                        .setParallelismForJobVertex(sink.getID(), 1, 1)
                        .build());
        JobResourceRequirements rescaled =
                JobResourceRequirements.newBuilder()
                        .setParallelismForJobVertex(source.getID(), 1, 3)
                        .setParallelismForJobVertex(sink.getID(), 2, 2)
                        .build();
        plans.putJobResourceRequirements(graph.getJobID(), rescaled);

        JobregBridge standbyBridge = JobregBridge.start(configuration);
        resources.add(standbyBridge::close);
        ExecutionPlanStore standby = started(services(standbyBridge).getExecutionPlanStore());
        assertThatThrownBy(
                        () ->
                                standby.putJobResourceRequirements(
                                        graph.getJobID(),
                                        JobResourceRequirements.newBuilder()
                                                .setParallelismForJobVertex(source.getID(), 9, 9)
                                                .setParallelismForJobVertex(sink.getID(), 9, 9)
                                                .build()))
                .isInstanceOf(JobregBridgeException.class);

        ExecutionPlanStore recovering =
                started(leadingServicesAfter(first).getExecutionPlanStore());
        assertThat(JobResourceRequirements.readFromExecutionPlan(
                        recovering.recoverExecutionPlan(graph.getJobID())))
                .contains(rescaled);
    }

    @Test
    void testAStoreThatDoesNotLeadRethrowsTheFailure() throws Exception {
        JobregHaServices leader = leadingServices();
        ExecutionPlanStore plans = started(leader.getExecutionPlanStore());
        JobGraph broken = job();
        plans.putExecutionPlan(broken);
        corrupt(leader.getBridge(), broken.getJobID());

        JobregBridge standbyBridge = JobregBridge.start(configuration);
        resources.add(standbyBridge::close);
        ExecutionPlanStore standby = started(services(standbyBridge).getExecutionPlanStore());
        assertThatThrownBy(() -> standby.recoverExecutionPlan(broken.getJobID()))
                .hasMessageContaining("Could not retrieve submitted ExecutionPlan");
        // Nothing recorded: the leader still lists it.
        assertThat(plans.getJobIds()).containsExactly(broken.getJobID());
    }
}
