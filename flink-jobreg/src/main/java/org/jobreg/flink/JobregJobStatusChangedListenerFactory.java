/*
 * jobreg: an event-sourced job registry for HA coordinators.
 */

package org.jobreg.flink;

import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.DeploymentOptions;
import org.apache.flink.core.execution.JobExecutionStatusEvent;
import org.apache.flink.core.execution.JobStatusChangedEvent;
import org.apache.flink.core.execution.JobStatusChangedListener;
import org.apache.flink.core.execution.JobStatusChangedListenerFactory;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;

/**
 * Records a job's end in jobreg at the moment Flink's execution graph decides it (seed 001's
 * window): a cancel when the graph enters CANCELLING, any other end when it reaches a globally
 * terminal status.
 *
 * <p>Flink 2.3's {@code DefaultExecutionGraph.transitionState} sets the new status, logs "switched
 * from state X to Y", then calls the {@link JobStatusChangedListener}s of {@code
 * execution.job-status-changed-listeners} synchronously on the JobMaster's main thread, and only
 * afterwards completes the graph's termination future, from which the JobMaster tells the
 * Dispatcher, which then writes its dirty job result. The checkpoint services' shutdown with the
 * terminal status runs even later (when the scheduler closes, after the Dispatcher's write). So
 * this listener is the earliest point at which the registry can learn that a job ended. {@link
 * JobregHaServicesFactory} adds it to the JobManager's configuration where that configuration can
 * be changed (the standalone entrypoints); set {@code execution.job-status-changed-listeners:
 * org.jobreg.flink.JobregJobStatusChangedListenerFactory} to be sure.
 *
 * <p><b>A cancel is recorded at CANCELLING, as CANCELED.</b> Recorded at CANCELED, the record
 * (~19 ms through the bridge) came after Flink's "CANCELLING to CANCELED" line, and a JobManager
 * killed 2-8 ms after that line still had its job run again by the next leader. Recorded at
 * CANCELLING, synchronously: the later transition to CANCELED runs on the same main thread after
 * this listener returned, so no one can observe CANCELED (log line, REST, Dispatcher) before the
 * record is in the log. Why a cancel is irrevocable once the graph is CANCELLING, as read in Flink
 * 2.3.0's {@code flink-runtime} classes ({@code javap -c -p}):
 *
 * <ul>
 *   <li>{@code DefaultExecutionGraph.transitionState(current, new)} is a compare-and-set on the
 *       current status, on the main thread. The only transitions out of CANCELLING: {@code
 *       allVerticesInTerminalState()} CANCELLING to CANCELED (the normal end); the cancel
 *       future's failure handler ({@code lambda$cancel$4}) CANCELLING to FAILED ("Could not
 *       cancel job"); {@code failJob} (a failure the scheduler cannot restart) CANCELLING to
 *       FAILING, whose completion ({@code lambda$failJob$8}) ends FAILED, or CANCELED if the
 *       graph is CANCELLING again; {@code suspend} (leadership lost, the JobMaster closing) to
 *       SUSPENDED. {@code cancel()} itself moves only RUNNING, CREATED, RESTARTING and FAILING to
 *       CANCELLING.
 *   <li>No restart passes through CANCELLING: the {@code DefaultScheduler}'s restarts are RUNNING
 *       to RESTARTING and back ({@code addVerticesToRestartPending}, {@code
 *       removeVerticesFromRestartPending}), both compare-and-set, so no-ops while CANCELLING; and
 *       {@code SchedulerBase.cancel()} increments every vertex's version before it cancels the
 *       graph, which discards restarts already pending. No class of {@code
 *       org.apache.flink.runtime.scheduler} other than the adaptive scheduler's {@code Canceling}
 *       names CANCELLING.
 *   <li>The {@code AdaptiveScheduler}'s {@code Canceling} state cancels the graph in its
 *       constructor, ignores {@code cancel()} and every failure ({@code onFailure} does nothing:
 *       no restart), and goes to {@code Finished} on the globally terminal status; a lost
 *       leadership ends it SUSPENDED, as every state with an execution graph.
 * </ul>
 *
 * <p>So a CANCELLING job ends CANCELED, FAILED (a cancel that itself failed: jobreg keeps
 * CANCELLED, the first record, and the Dispatcher's FAILED result finds a result there), or
 * SUSPENDED when leadership is lost, where the next leader must not run it again: the record
 * makes the cancel hold. The globally terminal statuses (FINISHED, FAILED, and CANCELED again,
 * idempotent) are still recorded when reached.
 */
public class JobregJobStatusChangedListenerFactory implements JobStatusChangedListenerFactory {

    private static final Logger LOG =
            LoggerFactory.getLogger(JobregJobStatusChangedListenerFactory.class);

    /** Flink instantiates the factory reflectively. */
    public JobregJobStatusChangedListenerFactory() {}

    @Override
    public JobStatusChangedListener createListener(Context context) {
        String namespace = JobregHaOptions.namespace(context.getConfiguration());
        return new Listener(namespace);
    }

    /** Adds this factory to {@code execution.job-status-changed-listeners} unless it is there. */
    static void register(Configuration configuration) {
        List<String> listeners = configuration.get(DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS);
        String name = JobregJobStatusChangedListenerFactory.class.getName();
        if (listeners != null && listeners.contains(name)) {
            return;
        }
        List<String> updated = listeners == null ? new ArrayList<>() : new ArrayList<>(listeners);
        updated.add(name);
        try {
            configuration.set(DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS, updated);
        } catch (UnsupportedOperationException e) {
            // MiniCluster hands out an unmodifiable configuration.
            LOG.warn(
                    "Cannot add {} to {} (the configuration is unmodifiable): set it there, or a"
                            + " JobManager killed right after a job ended may run it again.",
                    name,
                    DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS.key());
            return;
        }
        LOG.info(
                "Added {} to {}: jobreg records a job's end as its execution graph reaches it.",
                name,
                DeploymentOptions.JOB_STATUS_CHANGED_LISTENERS.key());
    }

    private static final class Listener implements JobStatusChangedListener {

        private final String namespace;

        Listener(String namespace) {
            this.namespace = namespace;
        }

        @Override
        public void onEvent(JobStatusChangedEvent event) {
            if (!(event instanceof JobExecutionStatusEvent)) {
                return;
            }
            JobStatus newStatus = ((JobExecutionStatusEvent) event).newStatus();
            JobStatus status;
            if (newStatus == JobStatus.CANCELLING) {
                // The cancel is irrevocable from here (see the class's javadoc).
                status = JobStatus.CANCELED;
            } else if (newStatus != null && newStatus.isGloballyTerminalState()) {
                status = newStatus;
            } else {
                return;
            }
            List<JobregBridge> bridges = JobregBridge.liveBridges(namespace);
            if (bridges.isEmpty()) {
                LOG.warn(
                        "No jobreg bridge of namespace {} in this JVM: the end of job {} is"
                                + " recorded by the Dispatcher's job result only.",
                        namespace,
                        event.jobId());
            }
            // Synchronously: the record is in the log before the execution graph moves on (to
            // CANCELED after CANCELLING) and before its termination future completes. A bridge that does not lead answers NotLeader (only logged).
            for (JobregBridge bridge : bridges) {
                JobregJobTerminal.record(bridge, event.jobId(), status);
            }
        }
    }
}
