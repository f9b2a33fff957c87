/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.jobgraph.JobResourceRequirements;
import org.apache.flink.runtime.jobgraph.JobVertexID;
import org.apache.flink.runtime.jobgraph.JobVertexResourceRequirements;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStore;
import org.apache.flink.streaming.api.graph.ExecutionPlan;
import org.apache.flink.util.ExceptionUtils;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.JsonNodeFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Collection;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

/**
 * Flink's execution plan store on jobreg, where a plan that cannot be recovered fails its job
 * alone (seed 003).
 *
 * <p>Flink 2.3's {@code SessionDispatcherLeaderProcess.tryRecoverJob} turns an exception of
 * {@link ExecutionPlanStore#recoverExecutionPlan} into a {@code FlinkRuntimeException("Could not
 * recover job with job id ...")}, which ends the new leader (its fatal error handler), and the
 * next leader fails the same way on the same plan: one unreadable plan takes every JobManager
 * down. A {@code null} plan it skips ("Skipping recovery of job with job id ..., because it
 * already finished in a previous execution") and recovers the other jobs. (Both read in Flink
 * 2.3.0's {@code SessionDispatcherLeaderProcess} class.)
 *
 * <p>So this store wraps Flink's {@link
 * org.apache.flink.runtime.jobmanager.DefaultExecutionPlanStore}: when reading or deserializing
 * a plan fails, it records the failure in jobreg ({@code plan_failed}: the job becomes {@code
 * RECOVERY_FAILED} with the error kept, as jobreg's own recovery does it, and is no longer
 * listed for recovery), logs one line, and returns {@code null}. A failure that comes from the
 * registry itself (the bridge answered an error while the plan was looked up) is not the plan's
 * fault and is rethrown, as is the original failure when the bridge answers {@code NotLeader} or
 * {@code Fenced} to the record: the leadership is gone anyway. Any other failure to record (an
 * unknown outcome, the broker unreachable) is logged and the job is skipped all the same: the
 * plan cannot be read, and the job stays listed, so the next leader tries it again.
 */
public class JobregExecutionPlanStore implements ExecutionPlanStore {

    private static final Logger LOG = LoggerFactory.getLogger(JobregExecutionPlanStore.class);

    private final ExecutionPlanStore delegate;
    private final JobregBridge bridge;

    public JobregExecutionPlanStore(ExecutionPlanStore delegate, JobregBridge bridge) {
        this.delegate = delegate;
        this.bridge = bridge;
    }

    @Override
    public ExecutionPlan recoverExecutionPlan(JobID jobId) throws Exception {
        ExecutionPlan plan;
        try {
            plan = delegate.recoverExecutionPlan(jobId);
        } catch (Exception failure) {
            if (failure instanceof InterruptedException
                    || ExceptionUtils.findThrowable(failure, JobregBridgeException.class)
                            .isPresent()) {
                throw failure; // the registry's failure, not the plan's
            }
            ObjectNode request = JobregBridge.request("plan_failed");
            request.put("job", jobId.toHexString());
            request.put("error", describe(failure));
            try {
                bridge.callUninterruptibly(request);
            } catch (JobregBridgeException e) {
                if (e.isNotLeader()) {
                    failure.addSuppressed(e);
                    throw failure;
                }
                LOG.warn(
                        "Execution plan of job {} cannot be recovered ({}); skipped, and jobreg"
                                + " could not record it: {}",
                        jobId,
                        describe(failure),
                        e.getMessage());
                return null;
            }
            LOG.error(
                    "Execution plan of job {} cannot be recovered; recorded in jobreg as"
                            + " RECOVERY_FAILED, the job is skipped: {}",
                    jobId,
                    describe(failure));
            return null;
        }
        if (plan != null) {
            withRecordedRequirements(jobId, plan);
        }
        return plan;
    }

    /**
     * Gives the recovered plan the requirements of the job's newest rescale in jobreg (none
     * set: the plan as submitted). A failure to read them is the registry's and is thrown, as
     * a plan recovered without them would run at the parallelism the rescale replaced.
     */
    private void withRecordedRequirements(JobID jobId, ExecutionPlan plan) throws Exception {
        ObjectNode request = JobregBridge.request("plan_requirements");
        request.put("job", jobId.toHexString());
        JsonNode recorded = bridge.call(request).path("requirements");
        if (recorded.size() == 0) {
            return;
        }
        JobResourceRequirements.Builder requirements = JobResourceRequirements.newBuilder();
        for (JsonNode vertex : recorded) {
            requirements.setParallelismForJobVertex(
                    JobVertexID.fromHexString(vertex.path("vertex").asText()),
                    vertex.path("lower").asInt(),
                    vertex.path("upper").asInt());
        }
        JobResourceRequirements.writeToExecutionPlan(plan, requirements.build());
        LOG.info(
                "Execution plan of job {} recovered with the resource requirements of its"
                        + " newest rescale in jobreg: {}",
                jobId,
                recorded);
    }

    /** The failure and its deepest cause, on one line. */
    static String describe(Throwable failure) {
        Throwable deepest = failure;
        while (deepest.getCause() != null && deepest.getCause() != deepest) {
            deepest = deepest.getCause();
        }
        String text = String.valueOf(failure);
        if (deepest != failure) {
            text = text + " (caused by " + deepest + ")";
        }
        return String.join(" ", text.split("\\s+"));
    }

    @Override
    public void start(ExecutionPlanListener executionPlanListener) throws Exception {
        delegate.start(executionPlanListener);
    }

    @Override
    public void stop() throws Exception {
        delegate.stop();
    }

    @Override
    public Collection<JobID> getJobIds() throws Exception {
        return delegate.getJobIds();
    }

    @Override
    public void putExecutionPlan(ExecutionPlan executionPlan) throws Exception {
        delegate.putExecutionPlan(executionPlan);
    }

    /**
     * A rescale as a fenced record of its own ({@code plan_rescale}: a {@code JobRescaled} in
     * jobreg), never a replace of the stored plan (what Flink's {@code DefaultExecutionPlanStore}
     * does): the plan's file stays as submitted, and {@link #recoverExecutionPlan} gives a new
     * leader's plan the requirements jobreg holds. A bridge that does not lead answers {@code
     * NotLeader} or {@code Fenced}, and the Dispatcher fails the request.
     */
    @Override
    public void putJobResourceRequirements(
            JobID jobId, JobResourceRequirements jobResourceRequirements) throws Exception {
        ArrayNode vertices = JsonNodeFactory.instance.arrayNode();
        for (JobVertexID vertex : jobResourceRequirements.getJobVertices()) {
            JobVertexResourceRequirements.Parallelism parallelism =
                    jobResourceRequirements.getParallelism(vertex);
            ObjectNode entry = vertices.addObject();
            entry.put("vertex", vertex.toHexString());
            entry.put("lower", parallelism.getLowerBound());
            entry.put("upper", parallelism.getUpperBound());
        }
        ObjectNode request = JobregBridge.request("plan_rescale");
        request.put("job", jobId.toHexString());
        request.set("requirements", vertices);
        bridge.call(request);
    }

    @Override
    public CompletableFuture<Void> localCleanupAsync(JobID jobId, Executor executor) {
        return delegate.localCleanupAsync(jobId, executor);
    }

    @Override
    public CompletableFuture<Void> globalCleanupAsync(JobID jobId, Executor executor) {
        return delegate.globalCleanupAsync(jobId, executor);
    }
}
