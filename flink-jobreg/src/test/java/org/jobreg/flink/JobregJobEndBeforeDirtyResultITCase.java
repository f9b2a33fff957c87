/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.execution.DefaultJobExecutionStatusEvent;
import org.apache.flink.core.execution.JobStatusChangedListener;
import org.apache.flink.core.execution.JobStatusChangedListenerFactory;
import org.apache.flink.runtime.blob.BlobUtils;
import org.apache.flink.runtime.highavailability.FileSystemApplicationResultStore;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.JobGraphTestUtils;
import org.apache.flink.runtime.jobgraph.JobVertex;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStore;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testtasks.NoOpInvokable;
import org.apache.flink.util.concurrent.Executors;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Seed 001's window, deterministically: a JobManager dies after its job reached CANCELED and
 * before its Dispatcher wrote the dirty job result. What the next leader's Dispatcher reads (the
 * execution plans' job ids, the dirty results) decides whether the cancelled job runs again.
 * {@link JobregJobStatusChangedListenerFactory}'s listener, which Flink calls inside the
 * execution graph's transition to CANCELLING (and again to CANCELED), has recorded the end by then: the plan is no longer
 * listed and a dirty CANCELED result is. Without that record (the control), the next leader
 * recovers the plan, as Flink's ZooKeeper backend does.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class JobregJobEndBeforeDirtyResultITCase {

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

    /** A JobManager's HA services on a bridge that leads. */
    private JobregHaServices leadingServices() throws Exception {
        JobregTestUtils.Leader leader = JobregTestUtils.startLeader(configuration);
        resources.add(leader);
        JobregHaServices services =
                new JobregHaServices(
                        configuration,
                        executor,
                        BlobUtils.createBlobStoreFromConfig(configuration),
                        leader.bridge,
                        FileSystemApplicationResultStore.fromConfiguration(
                                configuration, executor));
        return services;
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

    private JobID submitThenCrash(boolean recordTheEnd) throws Exception {
        return submitThenCrash(recordTheEnd ? JobStatus.CANCELED : null);
    }

    /**
     * Submits a plan, then (unless {@code reached} is null) calls the listener as {@code
     * DefaultExecutionGraph.transitionState} does when the graph reaches {@code reached} from its
     * previous status, then kills the JobManager's bridge.
     */
    private JobID submitThenCrash(JobStatus reached) throws Exception {
        JobregHaServices first = leadingServices();
        JobVertex vertex = new JobVertex("v");
        vertex.setInvokableClass(NoOpInvokable.class);
        JobGraph job = JobGraphTestUtils.streamingJobGraph(vertex);
        ExecutionPlanStore plans = started(first.getExecutionPlanStore());
        plans.putExecutionPlan(job);
        assertThat(plans.getJobIds()).contains(job.getJobID());

        if (reached != null) {
            // What DefaultExecutionGraph.transitionState does right after logging
            // "switched from state <previous> to <reached>".
            JobStatusChangedListener listener =
                    new JobregJobStatusChangedListenerFactory()
                            .createListener(
                                    new JobStatusChangedListenerFactory.Context() {
                                        @Override
                                        public Configuration getConfiguration() {
                                            return configuration;
                                        }

                                        @Override
                                        public ClassLoader getUserClassLoader() {
                                            return getClass().getClassLoader();
                                        }

                                        @Override
                                        public Executor getIOExecutor() {
                                            return executor;
                                        }
                                    });
            JobStatus previous =
                    reached == JobStatus.CANCELED ? JobStatus.CANCELLING : JobStatus.RUNNING;
            listener.onEvent(
                    new DefaultJobExecutionStatusEvent(
                            job.getJobID(), "job", previous, reached, null));
        }
        // The crash: the JobManager's bridge dies with it; nothing else is written.
        ProcessHandle.of(first.getBridge().pid()).ifPresent(ProcessHandle::destroyForcibly);
        first.getBridge().closedFuture().get(30, TimeUnit.SECONDS);
        return job.getJobID();
    }

    @Test
    void testACancelledJobIsNotRecoveredByTheNextLeader() throws Exception {
        JobID jobId = submitThenCrash(true);

        JobregHaServices next = leadingServices();
        assertThat(started(next.getExecutionPlanStore()).getJobIds()).doesNotContain(jobId);
        assertThat(next.getJobResultStore().getDirtyResults())
                .singleElement()
                .satisfies(
                        result -> {
                            assertThat(result.getJobId()).isEqualTo(jobId);
                            assertThat(result.getJobStatus()).contains(JobStatus.CANCELED);
                        });
    }

    /**
     * The cancel is recorded when the graph enters CANCELLING: a JobManager killed before its
     * graph reached CANCELED (or at any moment after) leaves a cancelled job, never a plan.
     */
    @Test
    void testACancelIsRecordedWhenTheJobIsCancelling() throws Exception {
        JobID jobId = submitThenCrash(JobStatus.CANCELLING);

        JobregHaServices next = leadingServices();
        assertThat(started(next.getExecutionPlanStore()).getJobIds()).doesNotContain(jobId);
        assertThat(next.getJobResultStore().getDirtyResults())
                .singleElement()
                .satisfies(
                        result -> {
                            assertThat(result.getJobId()).isEqualTo(jobId);
                            assertThat(result.getJobStatus()).contains(JobStatus.CANCELED);
                        });
    }

    /** A status a job leaves again (here RESTARTING) records nothing: the plan is recovered. */
    @Test
    void testAStatusThatIsNotAnEndRecordsNothing() throws Exception {
        JobID jobId = submitThenCrash(JobStatus.RESTARTING);

        JobregHaServices next = leadingServices();
        assertThat(started(next.getExecutionPlanStore()).getJobIds()).contains(jobId);
        assertThat(next.getJobResultStore().getDirtyResults())
                .extracting(JobResult::getJobId)
                .doesNotContain(jobId);
    }

    @Test
    void testWithoutTheRecordTheNextLeaderRecoversThePlan() throws Exception {
        JobID jobId = submitThenCrash(false);

        JobregHaServices next = leadingServices();
        assertThat(started(next.getExecutionPlanStore()).getJobIds()).contains(jobId);
        assertThat(next.getJobResultStore().getDirtyResults())
                .extracting(JobResult::getJobId)
                .doesNotContain(jobId);
    }
}
