/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.jobgraph.JobResourceRequirements;
import org.apache.flink.runtime.jobmanager.ExecutionPlanStore;
import org.apache.flink.streaming.api.graph.ExecutionPlan;
import org.apache.flink.util.ExceptionUtils;

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
        try {
            return delegate.recoverExecutionPlan(jobId);
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

    @Override
    public void putJobResourceRequirements(
            JobID jobId, JobResourceRequirements jobResourceRequirements) throws Exception {
        delegate.putJobResourceRequirements(jobId, jobResourceRequirements);
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
